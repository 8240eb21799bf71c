// Package kueue runs Kueue (sigs.k8s.io/kueue), the real one, against the
// local cloud's kube-apiserver: its controller manager is the binary of
// its release that `make tools` builds into RAYDROP_CACHE (its go.mod pins
// KubeRay, k8s.io and controller-runtime versions other than raydrop's),
// with its release's CRDs and admission webhooks.
//
// In a cluster, Kueue's Service names its webhooks and its own certificate
// manager signs for that name. Here the API server calls them at
// 127.0.0.1, so Start turns that manager off and does what it would: a CA
// and a serving certificate for 127.0.0.1, the CA in the conversion
// webhooks of the five CRDs that have one and in the webhook
// configurations. Only the webhooks of Kueue's objects and of RayJobs are
// installed, and ray.io/rayjob is the one framework enabled.
package kueue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/raydrop/raydrop/infra/localcloud/emulators"
)

// Version is the Kueue release the local cloud runs (KUEUE_VERSION in
// the Makefile).
const Version = "v0.17.0"

// Env names the folder of the built release: the kueue binary, and its
// config/crd and config/webhook (default: kueue-<Version> in
// RAYDROP_CACHE).
const Env = "RAYDROP_KUEUE"

// Namespace is Kueue's own namespace.
const Namespace = "kueue-system"

// Options configure a Kueue.
type Options struct {
	// Config and Kubeconfig reach the API server (Kubeconfig is the
	// manager's, Config Start's own client's).
	Config     *rest.Config
	Kubeconfig string
	// Dir holds its configuration, certificates and log (kueue.log).
	Dir string
	// Log receives Start's records.
	Log *slog.Logger
}

// Kueue is a running Kueue controller manager.
type Kueue struct {
	// LogPath is the manager's output.
	LogPath string
	// Webhooks is how many admission webhooks were installed.
	Webhooks int
	cmd      *exec.Cmd
	exited   chan struct{}
	waitErr  error
}

// Release is the folder of the built release (see Env).
func Release() (string, error) {
	dir, pattern, err := emulators.FromCache(Env, "kueue-"+Version)
	if err != nil {
		return "", err
	}
	if dir == "" {
		return "", fmt.Errorf("kueue %s not found at %s: run `make tools` in the repository root (it builds infra/tools/kueue), or set %s", Version, pattern, Env)
	}
	if _, err := os.Stat(filepath.Join(dir, "kueue")); err != nil {
		return "", fmt.Errorf("kueue %s: %w: run `make tools`", Version, err)
	}
	return dir, nil
}

// Start installs Kueue's CRDs, starts its manager, and installs its
// webhooks once it is ready. It returns once the manager serves them; on
// any error it stops what it started.
func Start(ctx context.Context, o Options) (_ *Kueue, err error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	release, err := Release()
	if err != nil {
		return nil, err
	}
	if err := ensureMetricsCerts(); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(o.Dir, 0o755); err != nil {
		return nil, fmt.Errorf("kueue: %w", err)
	}
	p, err := newPKI(o.Dir)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	webhook, health, metrics := ports[0], ports[1], ports[2]
	base := "https://127.0.0.1:" + strconv.Itoa(webhook)
	t0 := time.Now()
	if err := installCRDs(ctx, o.Config, filepath.Join(release, "config"), base+"/convert", p.caPEM); err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(o.Config)
	if err != nil {
		return nil, err
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: Namespace}}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("kueue: namespace: %w", err)
	}
	cfgPath := filepath.Join(o.Dir, "controller_manager_config.yaml")
	if err := os.WriteFile(cfgPath, []byte(configuration(webhook, health, metrics, p.certDir)), 0o644); err != nil {
		return nil, fmt.Errorf("kueue: %w", err)
	}
	k := &Kueue{LogPath: filepath.Join(o.Dir, "kueue.log"), exited: make(chan struct{})}
	logf, err := os.Create(k.LogPath)
	if err != nil {
		return nil, fmt.Errorf("kueue: %w", err)
	}
	defer func() { _ = logf.Close() }() // the child holds its own copy
	k.cmd = exec.Command(filepath.Join(release, "kueue"), "--config="+cfgPath, "--kubeconfig="+o.Kubeconfig, "--zap-log-level=info")
	k.cmd.Env = append(os.Environ(), "KUBECONFIG="+o.Kubeconfig)
	k.cmd.Stdout, k.cmd.Stderr = logf, logf
	k.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := k.cmd.Start(); err != nil {
		return nil, fmt.Errorf("kueue: start: %w", err)
	}
	go func() { k.waitErr = k.cmd.Wait(); close(k.exited) }()
	defer func() {
		if err != nil {
			_ = k.Stop()
		}
	}()
	if err := k.waitReady(ctx, fmt.Sprintf("http://127.0.0.1:%d/readyz", health)); err != nil {
		return nil, err
	}
	if k.Webhooks, err = installWebhooks(ctx, cs, filepath.Join(release, "config"), base, p.caPEM); err != nil {
		return nil, err
	}
	o.Log.Info("kueue up", "version", Version, "webhooks", base, "webhook_count", k.Webhooks, "took", time.Since(t0).Round(time.Millisecond), "log", k.LogPath)
	return k, nil
}

// configuration is the manager's Configuration (config.kueue.x-k8s.io
// v1beta2): every listener on 127.0.0.1, no leader election (one
// manager), its certificate management off, RayJobs the one framework,
// and the on-demand visibility API server off (it would listen on every
// address; the Workloads' status says the same).
func configuration(webhook, health, metrics int, certDir string) string {
	return fmt.Sprintf(`apiVersion: config.kueue.x-k8s.io/v1beta2
kind: Configuration
namespace: %s
health:
  healthProbeBindAddress: 127.0.0.1:%d
metrics:
  bindAddress: 127.0.0.1:%d
webhook:
  host: 127.0.0.1
  port: %d
  certDir: %s
leaderElection:
  leaderElect: false
internalCertManagement:
  enable: false
clientConnection:
  qps: 50
  burst: 100
integrations:
  frameworks:
  - ray.io/rayjob
featureGates:
  VisibilityOnDemand: false
`, Namespace, health, metrics, webhook, certDir)
}

// waitReady waits for the manager's readiness endpoint to answer 200 (its
// webhook server started); an exit before that is the error, with the
// end of its log.
func (k *Kueue) waitReady(ctx context.Context, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	client := &http.Client{Timeout: 2 * time.Second}
	for {
		if resp, err := client.Get(url); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-k.exited:
			return fmt.Errorf("kueue: the manager exited before it was ready (%w): %s", k.waitErr, k.tail())
		case <-ctx.Done():
			return fmt.Errorf("kueue: not ready within 2 min: %s", k.tail())
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// tail is the end of the manager's log.
func (k *Kueue) tail() string {
	b, _ := os.ReadFile(k.LogPath)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-5):], "\n")
}

// Exited is closed when the manager's process ends.
func (k *Kueue) Exited() <-chan struct{} { return k.exited }

// Stop ends the manager: SIGTERM, then SIGKILL after 10 s. An exit of its
// own before Stop is the error.
func (k *Kueue) Stop() error {
	if k.cmd == nil || k.cmd.Process == nil {
		return nil
	}
	select {
	case <-k.exited:
		return fmt.Errorf("kueue: the manager had exited (%w): %s", k.waitErr, k.tail())
	default:
	}
	_ = k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.exited:
	case <-time.After(10 * time.Second):
		_ = k.cmd.Process.Kill()
		<-k.exited
	}
	return nil
}

// freePorts are n distinct free ports on 127.0.0.1.
func freePorts(n int) ([]int, error) {
	var ports []int
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, errors.Join(errors.New("kueue: free port"), err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
