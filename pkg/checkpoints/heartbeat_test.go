package checkpoints_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
)

// TestReadBeatsAndPulse reads heartbeats as trainer/heartbeat.py writes
// them (before the first step: nulls) and sums them up.
func TestReadBeatsAndPulse(t *testing.T) {
	root := t.TempDir()
	dir := filepath.Join(root, "exp", checkpoints.HeartbeatDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string]string{
		"rank-00000.json": `{"rank": 0, "step": 7, "stepAt": 1000.5, "firstStepAt": 900.0, "stepSeconds": 2.0, "activity": "evaluating", "activityAt": 1001.0, "at": 1010.0, "pid": 11, "host": "w-0"}`,
		"rank-00001.json": `{"rank": 1, "step": 6, "stepAt": 998.0, "firstStepAt": 901.0, "stepSeconds": 4.0, "activity": "training", "activityAt": 998.0, "at": 1012.0, "pid": 12, "host": "w-0"}`,
		"rank-00002.json": `{"rank": 2, "step": 0, "stepAt": null, "firstStepAt": null, "stepSeconds": null, "activity": "starting", "activityAt": 800.0, "at": 1011.0}`,
		"rank-00003.json": `{"rank": 3, "step":`,
		"notes.txt":       "not a beat",
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	st := checkpoints.Dir(root)
	beats, bad, err := checkpoints.ReadBeats(context.Background(), st, "exp")
	if err != nil {
		t.Fatal(err)
	}
	if len(beats) != 3 || beats[0].Rank != 0 || beats[2].Rank != 2 || len(bad) != 1 {
		t.Fatalf("beats %+v, bad %v", beats, bad)
	}
	if got := checkpoints.HeartbeatName("exp/", 3); got != "exp/"+checkpoints.HeartbeatDir+"/rank-00003.json" {
		t.Fatalf("name %s", got)
	}
	p, ok := checkpoints.PulseOf(beats)
	if !ok {
		t.Fatal("no pulse")
	}
	unix := func(s float64) time.Time { return time.Unix(0, int64(s*1e9)).UTC() }
	if p.Ranks != 3 || p.Step != 7 || !p.FirstStep.Equal(unix(900)) || !p.Moved.Equal(unix(1001)) || p.Doing != "evaluating" {
		t.Fatalf("pulse %+v", p)
	}
	if p.StepTime != 3*time.Second || !p.Beat.Equal(unix(1012)) {
		t.Fatalf("step time %s, beat %s", p.StepTime, p.Beat)
	}
	if len(p.Behind) != 2 || p.Behind[0] != 1 || p.Behind[1] != 2 {
		t.Fatalf("behind %v", p.Behind)
	}
	if _, ok := checkpoints.PulseOf(nil); ok {
		t.Fatal("a pulse without beats")
	}
}
