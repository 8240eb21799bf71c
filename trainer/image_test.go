package trainer

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"regexp"
	"strings"
	"testing"
)

// lockHeader is the first line lock.sh writes: the hash of the file the
// lock was compiled from, and the Python it was compiled for.
var lockHeader = regexp.MustCompile(`^# from (\S+) sha256:([0-9a-f]{64}), Python (\d+\.\d+), Linux x86_64$`)

// lockEntry is one locked package: its pin and its hashes.
type lockEntry struct {
	pin    string // name==version, the name normalised (PEP 503)
	hashes int
}

// readLock reads a lock file lock.sh wrote: its header and its entries.
func readLock(t *testing.T, path string) (header []string, entries map[string]lockEntry) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatalf("%v (make trainer-lock writes it)", err)
	}
	defer f.Close()
	entries = map[string]lockEntry{}
	var cur string
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case n == 1:
			header = lockHeader.FindStringSubmatch(line)
			if header == nil {
				t.Fatalf("%s: first line %q is not lock.sh's header (make trainer-lock)", path, line)
			}
		case strings.HasPrefix(line, "#") || strings.TrimSpace(line) == "":
		case strings.HasPrefix(line, " "):
			if cur == "" {
				t.Fatalf("%s:%d: an indented line before any package", path, n)
			}
			if strings.Contains(line, "--hash=sha256:") {
				e := entries[cur]
				e.hashes++
				entries[cur] = e
			}
		default:
			name, version, ok := strings.Cut(strings.TrimSpace(strings.TrimSuffix(line, "\\")), "==")
			if !ok {
				t.Fatalf("%s:%d: %q pins no version", path, n, line)
			}
			cur = normalise(name)
			entries[cur] = lockEntry{pin: cur + "==" + strings.TrimSpace(version)}
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return header, entries
}

// normalise is a package name as PEP 503 compares them.
func normalise(name string) string {
	return strings.ToLower(regexp.MustCompile(`[-_.]+`).ReplaceAllString(strings.TrimSpace(name), "-"))
}

func sha256File(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TestLockMatchesRequirements keeps the trainer image's lock equal to what
// it was compiled from: every pin of requirements.txt (and uv.in) locked at
// the same version, every package hashed, the lock's input hash equal to
// the input's, and the image's Ray and Python equal to the pins' and the
// lock's. A change to requirements.txt without `make trainer-lock` fails
// here.
func TestLockMatchesRequirements(t *testing.T) {
	for _, c := range []struct{ lock, input string }{
		{"image/requirements.lock", "requirements.txt"},
		{"image/uv.lock.txt", "image/uv.in"},
	} {
		header, entries := readLock(t, c.lock)
		if want := sha256File(t, c.input); header[2] != want {
			t.Errorf("%s was compiled from a %s with sha256 %s, not the one here (%s): run make trainer-lock", c.lock, header[1], header[2], want)
		}
		if len(entries) == 0 {
			t.Errorf("%s locks no package", c.lock)
		}
		for name, e := range entries {
			if e.hashes == 0 {
				t.Errorf("%s: %s has no hash: install.sh installs with --require-hashes", c.lock, name)
			}
		}
		b, err := os.ReadFile(c.input)
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(b), "\n") {
			line, _, _ = strings.Cut(line, "#")
			name, version, ok := strings.Cut(strings.TrimSpace(line), "==")
			if !ok {
				continue
			}
			want := normalise(name) + "==" + strings.TrimSpace(version)
			if got := entries[normalise(name)].pin; got != want {
				t.Errorf("%s pins %s, %s locks %q: run make trainer-lock", c.input, want, c.lock, got)
			}
		}
	}

	header, _ := readLock(t, "image/requirements.lock")
	ray := ""
	for _, r := range Requirements() {
		if v, ok := strings.CutPrefix(r, "ray=="); ok {
			ray = v
		}
	}
	docker, err := os.ReadFile("image/Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	from := regexp.MustCompile(`(?m)^FROM rayproject/ray:(\S+)-py(\d)(\d+)-gpu$`).FindStringSubmatch(string(docker))
	if from == nil {
		t.Fatalf("image/Dockerfile builds FROM no rayproject/ray:<version>-py<XY>-gpu image")
	}
	if from[1] != ray {
		t.Errorf("image/Dockerfile is FROM Ray %s, requirements.txt pins ray==%s", from[1], ray)
	}
	if py := from[2] + "." + from[3]; py != header[3] {
		t.Errorf("image/Dockerfile's Python is %s, requirements.lock was compiled for %s: run make trainer-lock", py, header[3])
	}
}
