package evidence

import (
	"bytes"
	"strings"
	"testing"
)

// TestTail: the tail keeps the last n bytes of whatever is written, in
// writes of any size.
func TestTail(t *testing.T) {
	full := []byte(strings.Repeat("0123456789", 100))
	for _, n := range []int64{1, 7, 100, 999, 1000, 5000} {
		for _, chunk := range []int{1, 3, 64, 1000} {
			tl := newTail(n)
			for i := 0; i < len(full); i += chunk {
				if _, err := tl.Write(full[i:min(i+chunk, len(full))]); err != nil {
					t.Fatal(err)
				}
			}
			want := full[max(0, int64(len(full))-n):]
			if !bytes.Equal(tl.Bytes(), want) {
				t.Errorf("cap %d, writes of %d: kept %d bytes %q..., want the last %d", n, chunk, len(tl.Bytes()), tl.Bytes()[:min(10, len(tl.Bytes()))], len(want))
			}
		}
	}
}

// TestPodNames: the names KubeRay and the Job controller give an
// attempt's pods match; another cluster's or job's do not.
func TestPodNames(t *testing.T) {
	re := podNames(Target{Cluster: "c1", RayJob: "run-a-1"})
	for name, want := range map[string]bool{
		"c1-head-x7k2p":                 true,
		"c1-head":                       true,
		"c1-gpu-group-worker-ab12c":     true,
		"run-a-1-q9z8w":                 true,
		"c10-head-x7k2p":                false,
		"c1-gpu-group-worker-ab12c-x":   false,
		"run-a-10-q9z8w":                false,
		"other-c1-gpu-group-worker-abc": false,
	} {
		if got := re.MatchString(name); got != want {
			t.Errorf("%s: matched %v, want %v", name, got, want)
		}
	}
}

// TestLocate: an evidence folder's URI, as URI writes it, gives back its
// bucket and an attempt's folder; anything else is refused.
func TestLocate(t *testing.T) {
	b, f, err := Locate(URI("ckpt", "team/r1"), 2)
	if err != nil || b != "ckpt" || f != "team/r1/evidence/attempt-2" {
		t.Errorf("Locate(URI) = %q, %q, %v", b, f, err)
	}
	for _, bad := range []string{"", "gs://ckpt", "gs://ckpt/team/r1/", "gs://ckpt/evidence/", "s3://ckpt/team/r1/evidence/"} {
		if _, _, err := Locate(bad, 1); err == nil {
			t.Errorf("Locate(%q) accepted", bad)
		}
	}
}
