// Package kubetest starts a real kube-apiserver and etcd with the KubeRay
// CRDs installed, for tests and the local cloud. The binaries are built by
// `make tools` into RAYDROP_CACHE; KUBEBUILDER_ASSETS names their folder.
package kubetest

import (
	"time"

	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// KubeRayModule is the module whose CRDs are installed.
const KubeRayModule = "github.com/ray-project/kuberay/ray-operator"

// Env is a running API server.
type Env struct {
	Config *rest.Config
	env    *envtest.Environment
}

// Start starts etcd and kube-apiserver bound to 127.0.0.1 and installs the
// KubeRay CRDs (RayCluster, RayJob, RayService) from the module cache.
func Start() (*Env, error) {
	assets := os.Getenv("KUBEBUILDER_ASSETS")
	if assets == "" {
		return nil, errors.New("KUBEBUILDER_ASSETS is not set: run the tests through make (make test), which builds etcd and kube-apiserver into RAYDROP_CACHE")
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(assets, b)); err != nil {
			return nil, fmt.Errorf("%s not found in KUBEBUILDER_ASSETS=%s: run make tools", b, assets)
		}
	}
	crds, err := CRDDir()
	if err != nil {
		return nil, err
	}
	e := &envtest.Environment{
		CRDDirectoryPaths:     []string{crds},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assets,
		// envtest waits 10 s for the CRDs to be served by default; an API
		// server started beside others on a busy 2-core machine can take longer.
		CRDInstallOptions: envtest.CRDInstallOptions{MaxTime: 2 * time.Minute},
	}
	cfg, err := e.Start()
	if err != nil {
		return nil, fmt.Errorf("start kube-apiserver and etcd: %w", err)
	}
	return &Env{Config: cfg, env: e}, nil
}

// Stop stops the API server and etcd and removes their data.
func (e *Env) Stop() error { return e.env.Stop() }

// CRDDir is the folder of KubeRay's CRDs in the module cache, at the version
// this module requires.
func CRDDir() (string, error) {
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", KubeRayModule).Output()
	if err != nil {
		return "", fmt.Errorf("locate %s (go list -m): %w", KubeRayModule, err)
	}
	dir := filepath.Join(strings.TrimSpace(string(out)), "config", "crd", "bases")
	if _, err := os.Stat(dir); err != nil {
		return "", fmt.Errorf("kuberay CRDs: %w", err)
	}
	return dir, nil
}
