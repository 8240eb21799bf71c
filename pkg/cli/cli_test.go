package cli_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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

func TestRenderErrors(t *testing.T) {
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"render"}, 2, "give exactly one spec file"},
		{[]string{"render", "../../examples/gemma3-vision.json", "--run-id", "Bad ID"}, 2, "run id \"Bad ID\" is not a run id"},
		{[]string{"render", "../../examples/gemma3-vision.json", "--attempt", "9"}, 2, "--attempt 9 is out of range"},
		{[]string{"render", "../../examples/gemma3-vision.json", "--resume-from", "gs://b/x;rm -rf /"}, 2, "is not a gs:// checkpoint URI"},
		{[]string{"render", "../spec/testdata/bad/out-of-range.json"}, 1, "lora.r: 100000 is out of range"},
		{[]string{"render", "missing.json"}, 1, "no such file"},
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
