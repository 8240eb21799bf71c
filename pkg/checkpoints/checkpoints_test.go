package checkpoints_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/raydrop/raydrop/pkg/checkpoints"
)

// write lays out files under dir; an empty content writes an empty file.
func write(t *testing.T, dir string, files map[string]string) {
	t.Helper()
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

const trial = "run/attempt-1/TorchTrainer_1a2b3_00000_0_2026-11-30_10-00-00"

func adapter(ckpt string) map[string]string {
	d := trial + "/" + ckpt + "/checkpoint/"
	return map[string]string{d + "adapter_model.safetensors": "w", d + "adapter_config.json": "{}", d + "trainer_state.json": "{}"}
}

func TestDiscover(t *testing.T) {
	tests := []struct {
		name       string
		files      map[string]string
		wantCkpts  []string
		latest     string
		best       string
		incomplete int
		reports    int
	}{
		{
			name: "three epochs",
			files: merge(adapter("checkpoint_000000"), adapter("checkpoint_000001"), adapter("checkpoint_000002"), map[string]string{
				trial + "/result.json": `{"step": 5, "epoch": 0.5, "loss": 2.0, "checkpoint_dir_name": null, "timestamp": 1}
{"step": 10, "epoch": 1.0, "loss": 1.5, "checkpoint_dir_name": "checkpoint_000000", "config": {"a": 1}}
{"step": 20, "epoch": 2.0, "loss": 0.9, "checkpoint_dir_name": "checkpoint_000001"}
{"step": 30, "epoch": 3.0, "loss": 1.1, "checkpoint_dir_name": "checkpoint_000002"}
`,
				"run/attempt-1/raydrop_result.json": `{"status": "succeeded", "error": null, "finalMetrics": {"train_loss": 1.2, "train_runtime": 99.5}}`,
			}),
			wantCkpts: []string{"checkpoint_000000", "checkpoint_000001", "checkpoint_000002"},
			latest:    "checkpoint_000002", best: "checkpoint_000001", reports: 4,
		},
		{
			name: "torn last line and a checkpoint missing its adapter",
			files: merge(adapter("checkpoint_000000"), map[string]string{
				trial + "/checkpoint_000001/checkpoint/adapter_config.json": "{}",
				trial + "/result.json": `{"step": 10, "epoch": 1.0, "loss": 1.5, "checkpoint_dir_name": "checkpoint_000000"}
{"step": 20, "epoch": 2.0, "loss": 0.9, "checkpoint_dir_name": "checkpoint_000001"}
{"step": 25, "epoch": 2.`,
			}),
			wantCkpts: []string{"checkpoint_000000", "checkpoint_000001"},
			latest:    "checkpoint_000000", best: "checkpoint_000000", incomplete: 1, reports: 2,
		},
		{
			name:      "checkpoint folder without a report line",
			files:     merge(adapter("checkpoint_000000"), map[string]string{trial + "/result.json": ""}),
			wantCkpts: []string{"checkpoint_000000"},
			latest:    "checkpoint_000000", best: "checkpoint_000000",
		},
		{
			name:      "nothing written",
			files:     map[string]string{"run/attempt-1/.validate_storage_marker": ""},
			wantCkpts: nil,
		},
		{
			name: "newest of two trial folders",
			files: merge(adapter("checkpoint_000000"), map[string]string{
				"run/attempt-1/TorchTrainer_00000_00000_0_2026-11-29_10-00-00/result.json": `{"step": 1, "checkpoint_dir_name": null}`,
				trial + "/result.json": `{"step": 10, "epoch": 1, "loss": 1, "checkpoint_dir_name": "checkpoint_000000"}`,
			}),
			wantCkpts: []string{"checkpoint_000000"},
			latest:    "checkpoint_000000", best: "checkpoint_000000", reports: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, tt.files)
			res, err := checkpoints.Discover(context.Background(), checkpoints.Dir(dir), "run/attempt-1")
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, c := range res.Checkpoints {
				got = append(got, c.Name)
			}
			if strings.Join(got, ",") != strings.Join(tt.wantCkpts, ",") {
				t.Errorf("checkpoints %v, want %v", got, tt.wantCkpts)
			}
			if name(res.Latest) != tt.latest || name(res.Best) != tt.best {
				t.Errorf("latest %q best %q, want %q %q", name(res.Latest), name(res.Best), tt.latest, tt.best)
			}
			if len(res.Incomplete) != tt.incomplete || res.Reports != tt.reports {
				t.Errorf("incomplete %v reports %d", res.Incomplete, res.Reports)
			}
		})
	}
}

func TestDiscoverMetrics(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, merge(adapter("checkpoint_000000"), map[string]string{
		trial + "/result.json":              `{"step": 10, "epoch": 1.0, "loss": 1.5, "learning_rate": 0.0002, "checkpoint_dir_name": "checkpoint_000000", "timestamp": 17, "pid": 3, "hostname": "h", "raydrop_startup": {"started_at": 3.5, "weights_s": 4.25, "data_s": 1, "first_step_at": 16.5}}`,
		"run/attempt-1/raydrop_result.json": `{"status": "failed", "error": "ValueError: boom", "finalMetrics": {"train_runtime": 12.5}, "noticeSeen": true}`,
	}))
	res, err := checkpoints.Discover(context.Background(), checkpoints.Dir(dir), "run/attempt-1")
	if err != nil {
		t.Fatal(err)
	}
	c := res.Checkpoints[0]
	if c.Step != 10 || c.Epoch != 1 || c.Metrics["loss"] != 1.5 || c.Metrics["learning_rate"] != 0.0002 {
		t.Errorf("checkpoint %+v", c)
	}
	if _, ok := c.Metrics["timestamp"]; ok {
		t.Error("Ray's bookkeeping number timestamp kept as a metric")
	}
	if res.FirstReportAt == nil || res.FirstReportAt.Unix() != 17 {
		t.Errorf("first report at %v, want Ray's timestamp 17", res.FirstReportAt)
	}
	if su := res.TrainerStartup; su == nil || *su != (checkpoints.TrainerStartup{StartedAt: 3.5, WeightsSeconds: 4.25, DataSeconds: 1, FirstStepAt: 16.5}) {
		t.Errorf("the trainer's account of its start %+v", su)
	}
	if _, ok := c.Metrics[checkpoints.StartupKey]; ok {
		t.Error("the trainer's account of its start kept as a metric")
	}
	if res.Mark == nil || res.Mark.Status != "failed" || res.Mark.Error != "ValueError: boom" || !res.Mark.NoticeSeen {
		t.Errorf("mark %+v", res.Mark)
	}
	if res.FinalMetrics["train_runtime"] != 12.5 || res.FinalMetrics["loss"] != 1.5 {
		t.Errorf("final metrics %v", res.FinalMetrics)
	}
	if !strings.HasSuffix(c.URI, "checkpoint_000000/checkpoint") {
		t.Errorf("uri %s", c.URI)
	}
}

func name(c *checkpoints.Checkpoint) string {
	if c == nil {
		return ""
	}
	return c.Name
}

func merge(ms ...map[string]string) map[string]string {
	out := map[string]string{}
	for _, m := range ms {
		for k, v := range m {
			out[k] = v
		}
	}
	return out
}

// BenchmarkDiscover measures discovery over the storage tree the real
// trainer wrote (testdata/trainer-layout), from a local folder.
func BenchmarkDiscover(b *testing.B) {
	st := checkpoints.Dir("testdata/trainer-layout")
	b.ReportAllocs()
	for b.Loop() {
		if _, err := checkpoints.Discover(context.Background(), st, "exp-a"); err != nil {
			b.Fatal(err)
		}
	}
}
