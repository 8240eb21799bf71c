package main

import (
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
)

// canned answers gcloud's calls from testdata, by the command's first
// words (see testdata/README.md for where the files' shape comes from).
func canned(files map[string]string) gcloud {
	return func(args ...string) ([]byte, error) {
		key := strings.Join(args[:2], " ")
		if args[0] == "container" && args[1] == "clusters" {
			key = "container clusters describe"
		}
		f, ok := files[key]
		if !ok {
			return nil, fmt.Errorf("unexpected gcloud %v", args)
		}
		return os.ReadFile("testdata/" + f)
	}
}

func TestCheck(t *testing.T) {
	b200 := map[string]string{"compute regions": "region-b200.json", "container get-server-config": "server-config.json"}
	for _, tc := range []struct {
		name  string
		c     config
		files map[string]string
		want  []string // substrings of the error; none: the check passes
	}{
		{
			name:  "reservation: the limit covers the reserved GPUs already in use",
			c:     config{tiers: []string{tierReservation}, gpus: 16},
			files: b200,
		},
		{
			name:  "flex-start and Spot draw on the preemptible quota, and flex-start checks the version",
			c:     config{tiers: []string{tierReservation, tierFlexStart, tierSpot}, gpus: 16},
			files: b200,
		},
		{
			name:  "on demand needs room in the regular quota",
			c:     config{tiers: []string{tierOnDemand}, gpus: 16},
			files: b200,
			want:  []string{"NVIDIA_B200_GPUS has 0 of 16 free"},
		},
		{
			name:  "preemptible quota without room for a run",
			c:     config{tiers: []string{tierSpot}, gpus: 32},
			files: b200,
			want:  []string{"PREEMPTIBLE_NVIDIA_B200_GPUS has 24 of 32 free"},
		},
		{
			name:  "a fresh project: no B200 quota at all, no preemptible metric",
			c:     config{tiers: []string{tierReservation, tierFlexStart}, gpus: 16},
			files: map[string]string{"compute regions": "region-fresh.json", "container get-server-config": "server-config.json"},
			want:  []string{"NVIDIA_B200_GPUS quota is 0, a run needs 16", "no PREEMPTIBLE_NVIDIA_B200_GPUS quota"},
		},
		{
			name:  "flex-start on an existing cluster older than the minimum",
			c:     config{tiers: []string{tierFlexStart}, gpus: 8, cluster: "shared-gpu", location: "us-central1"},
			files: map[string]string{"compute regions": "region-b200.json", "container clusters describe": "cluster-old.json"},
			want:  []string{"needs GKE 1.33.0-gke.1712000 or later", "1.32.4-gke.1106006"},
		},
		{
			name:  "an unknown tier",
			c:     config{tiers: []string{"preemptible"}, gpus: 16},
			files: b200,
			want:  []string{`unknown capacity tier "preemptible"`},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.c.region, tc.c.accelerator, tc.c.minVersion = "us-central1", "nvidia-b200", minFlexStartVersion
			err := check(tc.c, canned(tc.files), io.Discard)
			if len(tc.want) == 0 {
				if err != nil {
					t.Fatalf("check: %v", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("check passed; want an error with %q", tc.want)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
		})
	}
}

func TestVersionAtLeast(t *testing.T) {
	for _, tc := range []struct {
		v    string
		want bool
	}{
		{"1.33.0-gke.1712000", true},
		{"1.33.0-gke.1711999", false},
		{"1.33.5-gke.1080000", true},
		{"1.32.9-gke.9999999", false},
		{"1.34.0-gke.1000", true},
	} {
		got, err := versionAtLeast(tc.v, minFlexStartVersion)
		if err != nil || got != tc.want {
			t.Errorf("versionAtLeast(%s) = %v, %v; want %v", tc.v, got, err, tc.want)
		}
	}
	if _, err := versionAtLeast("latest", minFlexStartVersion); err == nil {
		t.Error("versionAtLeast accepted a version that is not one")
	}
}

func TestQuotaMetric(t *testing.T) {
	for acc, want := range map[string]string{"nvidia-b200": "NVIDIA_B200_GPUS", "nvidia-l4": "NVIDIA_L4_GPUS", "nvidia-h100-80gb": "NVIDIA_H100_GPUS"} {
		if got := quotaMetric(acc); got != want {
			t.Errorf("quotaMetric(%s) = %s, want %s", acc, got, want)
		}
	}
}

func TestRegionOf(t *testing.T) {
	f := t.TempDir() + "/terraform.tfvars"
	if err := os.WriteFile(f, []byte("project_id = \"p\"\n# region = \"europe-west4\"\nregion     = \"us-east5\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := regionOf(f); got != "us-east5" {
		t.Errorf("regionOf = %s, want us-east5", got)
	}
	if got := regionOf(t.TempDir() + "/none"); got != "us-central1" {
		t.Errorf("regionOf(missing) = %s, want us-central1", got)
	}
}

// TestFromSpecs: the specs' tiers (each once, the default reservation
// for a spec without capacity), accelerator and largest GPU count replace
// the flags; specs of two accelerators are refused.
func TestFromSpecs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, extra string) string {
		p := dir + "/" + name
		body := `{"apiVersion": "raydrop.dev/v1", "kind": "FineTuneJob", "name": "` + strings.TrimSuffix(name, ".json") + `",
			"cluster": {"serviceAccount": "ray-sa", "reservation": "r"` + extra + `}, "output": {"bucket": "ckpt-bucket"}}`
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	plain := write("plain.json", "")
	tiers := write("tiers.json", `, "capacity": [{"type": "reservation", "wait": "10m"}, {"type": "flexStart", "wait": "10m"}, {"type": "spot"}]`)
	c, err := fromSpecs(config{tiers: []string{"onDemand"}, gpus: 1}, []string{plain, tiers})
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.tiers, ",") != "reservation,flexStart,spot" || c.accelerator != "nvidia-b200" || c.gpus != 16 {
		t.Errorf("from the specs: tiers %v, accelerator %s, %g GPUs", c.tiers, c.accelerator, c.gpus)
	}
	other := write("h200.json", `, "workers": {"accelerator": "nvidia-h200-141gb"}`)
	if _, err := fromSpecs(config{}, []string{plain, other}); err == nil || !strings.Contains(err.Error(), "nvidia-h200-141gb") {
		t.Errorf("two accelerators: %v", err)
	}
	bad := write("bad.json", `, "capacity": [{"type": "cheap"}]`)
	if _, err := fromSpecs(config{}, []string{bad}); err == nil || !strings.Contains(err.Error(), "bad.json") {
		t.Errorf("an invalid spec: %v", err)
	}
}
