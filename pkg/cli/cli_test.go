package cli_test

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/raydrop/raydrop/pkg/cli"
)

func run(args ...string) (int, string, string) {
	var out, errb bytes.Buffer
	code := cli.Run(context.Background(), args, strings.NewReader(""), &out, &errb)
	return code, out.String(), errb.String()
}

func TestValidateExample(t *testing.T) {
	code, out, stderr := run("validate", "../../examples/gemma3-vision.json")
	if code != 0 || stderr != "" || !strings.Contains(out, "valid") {
		t.Errorf("exit %d, stdout %q, stderr %q", code, out, stderr)
	}
}

// TestValidateBadSpecs runs validate on every bad spec kept as testdata by
// the spec package: exit 1, and stderr is exactly one "path: message" line
// per problem, the lines the spec package's golden files hold.
func TestValidateBadSpecs(t *testing.T) {
	files, _ := filepath.Glob("../spec/testdata/bad/*.json")
	if len(files) < 30 {
		t.Fatalf("only %d bad specs", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			code, out, stderr := run("validate", f)
			want, err := os.ReadFile(strings.TrimSuffix(f, ".json") + ".errors")
			if err != nil {
				t.Fatal(err)
			}
			if code != 1 || out != "" || stderr != string(want) {
				t.Errorf("exit %d, stdout %q, stderr:\n%s\nwant:\n%s", code, out, stderr, want)
			}
		})
	}
}

func TestRender(t *testing.T) {
	code, out, stderr := run("render", "../../examples/gemma3-vision.json", "--run-id", "example-run")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	for _, want := range []string{"kind: ConfigMap", "kind: RayCluster", "kind: RayJob", "name: example-run-1", "---\n"} {
		if !strings.Contains(out, want) {
			t.Errorf("render output lacks %q", want)
		}
	}
	// The same file renders to the same run ID without --run-id.
	_, a, _ := run("render", "../../examples/gemma3-vision.json")
	_, b, _ := run("render", "../../examples/gemma3-vision.json")
	if a != b || a == "" {
		t.Error("render without --run-id is not deterministic")
	}
}

// TestRenderTier: --tier renders the worker group on that capacity tier.
func TestRenderTier(t *testing.T) {
	code, out, stderr := run("render", "../spec/testdata/good/capacity-tiers.json", "--tier", "4")
	if code != 0 || !strings.Contains(out, "cloud.google.com/gke-spot: \"true\"") || strings.Contains(out, "reservation-name") {
		t.Errorf("render --tier 4: exit %d, stderr %q; want the Spot tier's node selector\n%s", code, stderr, out)
	}
}

// TestRenderTrainerImage: --trainer-image renders as the pipeline does on a
// deployment with one: both Ray containers and their raylogs sidecars on
// it, no pip in the runtime env; without it, the stock images and the pip
// list.
func TestRenderTrainerImage(t *testing.T) {
	const image = "us-docker.pkg.dev/p/raydrop/trainer@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	code, out, stderr := run("render", "../../examples/gemma3-vision.json", "--trainer-image", image)
	if code != 0 || strings.Count(out, "image: "+image) != 4 || strings.Contains(out, "rayproject/ray") || strings.Contains(out, "torch==") {
		t.Errorf("render --trainer-image: exit %d, stderr %q; want the head, the workers and their sidecars on it and no pip\n%s", code, stderr, out)
	}
	code, out, _ = run("render", "../../examples/gemma3-vision.json")
	if code != 0 || !strings.Contains(out, "image: rayproject/ray:2.48.0-gpu") || !strings.Contains(out, "torch==") {
		t.Errorf("render: exit %d; want the stock images and the pip list\n%s", code, out)
	}
}

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"render"}, 2, "give exactly one spec file"},
		{[]string{"render", "../../examples/gemma3-vision.json", "--run-id", "Bad ID"}, 2, "run id \"Bad ID\" is not a run id"},
		{[]string{"render", "../../examples/gemma3-vision.json", "--attempt", "13"}, 2, "--attempt 13 is out of range (allowed: 1 to 12, limits.retries + limits.preemptions + 1)"},
		{[]string{"render", "../../examples/gemma3-vision.json", "--tier", "2"}, 2, "--tier 2 is out of range (allowed: 1 to 1, the tiers of cluster.capacity)"},
		{[]string{"render", "../../examples/gemma3-vision.json", "--resume-from", "gs://b/x;rm -rf /"}, 2, "is not a gs:// checkpoint URI"},
		{[]string{"render", "../spec/testdata/bad/out-of-range.json"}, 1, "lora.r: 100000 is out of range"},
		{[]string{"render", "missing.json"}, 1, "no such file"},
		{[]string{"render", "../../examples/gemma3-vision.json", "--trainer-image", "r.example/trainer:latest"}, 2, "names no digest"},
		{[]string{"bogus"}, 2, "unknown command \"bogus\""},
		{[]string{"events", "--type", "finished"}, 2, `--type "finished": not an event type (allowed: accepted,`},
		{[]string{"events", "--count", "-1"}, 2, "--count -1: must be 0 (no limit) or more"},
	}
	for _, tt := range tests {
		code, _, stderr := run(tt.args...)
		if code != tt.code || !strings.Contains(stderr, tt.want) {
			t.Errorf("%v: exit %d, stderr %q; want exit %d and %q", tt.args, code, stderr, tt.code, tt.want)
		}
	}
}

func TestHelp(t *testing.T) {
	code, out, _ := run("help")
	if code != 0 || !strings.Contains(out, "validate") || !strings.Contains(out, "render") {
		t.Errorf("help: exit %d, %q", code, out)
	}
	for _, c := range []string{"validate", "render"} {
		code, out, _ := run(c, "--help")
		if code != 0 || !strings.Contains(out, "Usage: raydrop "+c) {
			t.Errorf("%s --help: exit %d, %q", c, code, out)
		}
	}
}

func TestValidateStdin(t *testing.T) {
	var out, errb bytes.Buffer
	data, _ := os.ReadFile("../../examples/gemma3-vision.json")
	code := cli.Run(context.Background(), []string{"validate", "-"}, bytes.NewReader(data), &out, &errb)
	if code != 0 {
		t.Errorf("exit %d: %s", code, errb.String())
	}
}

func TestComplete(t *testing.T) {
	t.Setenv("RAYDROP_PROJECT", "")
	t.Setenv("RAYDROP_INTAKE_BUCKET", "")
	lines := func(args ...string) []string {
		t.Helper()
		code, out, _ := run(append([]string{"__complete"}, args...)...)
		if code != 0 {
			t.Fatalf("__complete %v: exit %d", args, code)
		}
		return strings.Fields(out)
	}
	if got := lines(); !slices.Contains(got, "events") || !slices.Contains(got, "completion") || !slices.Contains(got, "watch") {
		t.Errorf("commands: %v", got)
	}
	got := lines("events")
	for _, want := range []string{"--json", "--run", "--type", "--count", "--project"} {
		if !slices.Contains(got, want) {
			t.Errorf("events flags %v lack %s", got, want)
		}
	}
	// After a flag that takes a value, the value is the user's: nothing.
	if got := lines("events", "--type"); len(got) != 0 {
		t.Errorf("after --type: %v", got)
	}
	// A boolean flag takes no value: the flags come again.
	if got := lines("events", "--json"); !slices.Contains(got, "--count") {
		t.Errorf("after --json: %v", got)
	}
	if got := lines("nosuch"); len(got) != 0 {
		t.Errorf("unknown command: %v", got)
	}
}

// TestCompletionScripts runs the bash script in a real bash, with a
// raydrop that answers as __complete does, and checks what it offers.
func TestCompletionScripts(t *testing.T) {
	for _, sh := range []string{"bash", "zsh", "fish"} {
		code, out, _ := run("completion", sh)
		if code != 0 || !strings.Contains(out, "raydrop __complete") {
			t.Errorf("completion %s: exit %d\n%s", sh, code, out)
		}
	}
	if code, _, errOut := run("completion", "tcsh"); code != 2 || !strings.Contains(errOut, "bash, zsh or fish") {
		t.Errorf("completion tcsh: exit %d %q", code, errOut)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	_, script, _ := run("completion", "bash")
	probe := script + `
raydrop() {
  [ "$1" = __complete ] || return 1; shift
  if [ $# -eq 0 ]; then printf '%s\n' events every watch; else printf '%s\n' --type --json "--$1"; fi
}
COMP_WORDS=(raydrop ev); COMP_CWORD=1; _raydrop; echo "${COMPREPLY[@]}"
COMP_WORDS=(raydrop events --ty); COMP_CWORD=2; _raydrop; echo "${COMPREPLY[@]}"
`
	out, err := exec.Command(bash, "--norc", "-c", probe).CombinedOutput()
	if err != nil {
		t.Fatalf("bash: %v\n%s", err, out)
	}
	if got := strings.Split(strings.TrimSpace(string(out)), "\n"); len(got) != 2 || got[0] != "events every" || got[1] != "--type" {
		t.Errorf("bash offered %q, want [\"events every\" \"--type\"]", got)
	}
}
