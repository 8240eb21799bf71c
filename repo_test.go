package raydrop

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

type goPackage struct {
	ImportPath string
	Name       string
	Doc        string
	Imports    []string
	Deps       []string
}

func listPackages(t *testing.T, args ...string) []goPackage {
	t.Helper()
	out, err := exec.Command("go", append([]string{"list", "-json"}, args...)...).Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	var pkgs []goPackage
	for dec.More() {
		var p goPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestPackagesHaveDocs requires a package comment on every package.
func TestPackagesHaveDocs(t *testing.T) {
	for _, p := range listPackages(t, "./...") {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("package %s has no doc comment", p.ImportPath)
		}
	}
}

// TestFunctionDependencies keeps the deployed functions lean: they use
// KubeRay's API types and clientset, never its controllers or a controller
// runtime, and no test infrastructure.
func TestFunctionDependencies(t *testing.T) {
	forbidden := []string{
		"github.com/ray-project/kuberay/ray-operator/controllers",
		"sigs.k8s.io/controller-runtime",
		"github.com/raydrop/raydrop/pkg/kubetest",
		"github.com/raydrop/raydrop/infra",
		"testing",
	}
	// KubeRay's API types register themselves through controller-runtime's
	// scheme builder; that one small package is the price of the types.
	allowed := map[string]bool{"sigs.k8s.io/controller-runtime/pkg/scheme": true}
	for _, p := range listPackages(t, "-deps=false", ".") {
		if !contains(p.Deps, "github.com/GoogleCloudPlatform/functions-framework-go/funcframework") {
			t.Fatalf("dependency list of %s looks wrong: %v", p.ImportPath, p.Deps)
		}
		t.Logf("the deployed functions build from %d packages", len(p.Deps))
		for _, d := range p.Deps {
			for _, f := range forbidden {
				if (d == f || strings.HasPrefix(d, f+"/")) && !allowed[d] {
					t.Errorf("the deployed functions depend on %s", d)
				}
			}
		}
	}
}

func contains(list []string, s string) bool { return slices.Contains(list, s) }

// TestLayering keeps each concern in its home: the function machinery
// (pkg/pipeline, functions/...) serves the functions alone. The report and
// the CLI reach the records, events and adapters through their own
// packages, never through it, and no other package imports pkg/pipeline
// for a table, a helper or a type.
func TestLayering(t *testing.T) {
	const module = "github.com/raydrop/raydrop"
	machinery := []string{module + "/pkg/pipeline", module + "/functions"}
	for _, p := range listPackages(t, "./pkg/report", "./pkg/cli", "./cmd/raydrop") {
		for _, d := range p.Deps {
			for _, m := range machinery {
				if d == m || strings.HasPrefix(d, m+"/") {
					t.Errorf("%s depends on the function machinery (%s)", p.ImportPath, d)
				}
			}
		}
	}
	for _, p := range listPackages(t, "./...") {
		if !contains(p.Imports, module+"/pkg/pipeline") {
			continue
		}
		if !strings.HasPrefix(p.ImportPath, module+"/functions") && !strings.HasPrefix(p.ImportPath, module+"/pkg/pipeline/") {
			t.Errorf("%s imports pkg/pipeline; only the functions and the pipeline's own test support may", p.ImportPath)
		}
	}
}

// TestHandlerFilesAreShort: every handler file reads top to bottom as the
// steps it takes; one that grows past 250 lines is split by concern.
func TestHandlerFilesAreShort(t *testing.T) {
	files, err := filepath.Glob("functions/*/*.go")
	if err != nil || len(files) == 0 {
		t.Fatalf("no handler files: %v", err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if n := bytes.Count(b, []byte("\n")); n > 250 {
			t.Errorf("%s has %d lines, more than 250", f, n)
		}
	}
}
