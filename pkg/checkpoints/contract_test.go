package checkpoints_test

import (
	"context"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/schemas"
)

var layout = flag.String("layout", "testdata/trainer-layout", "storage path written by the trainer's tests under real Ray Train (make trainer-contract sets it)")

// trainerMark is the part of the trainer's raydrop_result.json that this
// test compares with what discovery finds on its own.
type trainerMark struct {
	Status      string `json:"status"`
	Checkpoints []struct {
		DirName   string         `json:"dirName"`
		ModelPath string         `json:"modelPath"`
		Step      int64          `json:"step"`
		Epoch     float64        `json:"epoch"`
		Metrics   map[string]any `json:"metrics"`
	} `json:"checkpoints"`
	LatestCheckpoint *string                `json:"latestCheckpoint"`
	Data             *checkpoints.DataStats `json:"data"`
	Samples          *checkpoints.Samples   `json:"samples"`
	NoticeSeen       *bool                  `json:"noticeSeen"`
}

// TestTrainerLayoutContract runs checkpoint discovery over a storage tree
// that the real trainer wrote under real Ray Train, and checks that it finds
// the same checkpoints, steps, epochs and metrics as the trainer's own
// completion mark lists.
func TestTrainerLayoutContract(t *testing.T) {
	marks, _ := filepath.Glob(filepath.Join(*layout, "*", checkpoints.MarkFile))
	if len(marks) == 0 {
		t.Fatalf("no %s under %s", checkpoints.MarkFile, *layout)
	}
	sawCheckpoints := false
	for _, markPath := range marks {
		exp := filepath.Base(filepath.Dir(markPath))
		t.Run(exp, func(t *testing.T) {
			b, err := os.ReadFile(markPath)
			if err != nil {
				t.Fatal(err)
			}
			// The trainer's mark is the schema's, field for field.
			if err := schemas.ValidateMark(b); err != nil {
				t.Errorf("the trainer's mark breaks schemas/mark.v1.json: %v", err)
			}
			var m trainerMark
			if err := json.Unmarshal(b, &m); err != nil {
				t.Fatal(err)
			}
			// The driver's log is kept beside the mark, whatever the outcome.
			if log, err := os.ReadFile(filepath.Join(*layout, exp, checkpoints.DriverLogFile)); err != nil || !strings.Contains(string(log), "raydrop: "+m.Status+"; wrote") {
				t.Errorf("driver log of %s: %v, %d bytes without the closing line", exp, err, len(log))
			}
			res, err := checkpoints.Discover(context.Background(), checkpoints.Dir(*layout), exp)
			if err != nil {
				t.Fatal(err)
			}
			if res.Mark == nil || res.Mark.Status != m.Status {
				t.Fatalf("mark status: discovery %+v, file %q", res.Mark, m.Status)
			}
			// Ray times every report: the first one says when training
			// reached its first logged step (the start-up's last part).
			if res.Reports > 0 && res.FirstReportAt == nil {
				t.Errorf("%d reports, none with Ray's timestamp", res.Reports)
			}
			// The first report of a run that trained carries the trainer's
			// own account of its start (worker.py's raydrop_startup).
			if m.Status == "succeeded" && res.Reports > 0 && !res.TrainerStartup.Valid() {
				t.Errorf("%d reports, the first without the trainer's account of its start: %+v", res.Reports, res.TrainerStartup)
			}
			// Every mark says whether a preemption notice reached the attempt.
			if m.NoticeSeen == nil || res.Mark.NoticeSeen != *m.NoticeSeen {
				t.Errorf("mark noticeSeen: discovery %v, file %v", res.Mark.NoticeSeen, m.NoticeSeen)
			}
			switch {
			case (res.Mark.Data == nil) != (m.Data == nil):
				t.Errorf("mark data: discovery %+v, file %+v", res.Mark.Data, m.Data)
			case m.Data != nil && *res.Mark.Data != *m.Data:
				t.Errorf("mark data: discovery %+v, file %+v", *res.Mark.Data, *m.Data)
			case m.Status == "succeeded" && (m.Data == nil || m.Data.Rows == 0):
				t.Errorf("a succeeded run's mark has no dataset counts: %+v", m.Data)
			}
			if (res.Mark.Samples == nil) != (m.Samples == nil) || m.Samples != nil && *res.Mark.Samples != *m.Samples {
				t.Errorf("mark samples: discovery %+v, file %+v", res.Mark.Samples, m.Samples)
			}
			if m.Status == "succeeded" && (m.Samples == nil || m.Samples.Count == 0) {
				t.Errorf("a succeeded run's mark names no sample answers: %+v", m.Samples)
			}
			var complete []checkpoints.Checkpoint
			for _, c := range res.Checkpoints {
				if c.Complete {
					complete = append(complete, c)
				}
			}
			if len(complete) != len(m.Checkpoints) {
				t.Fatalf("discovery found %d complete checkpoints, the trainer lists %d", len(complete), len(m.Checkpoints))
			}
			for i, want := range m.Checkpoints {
				got := complete[i]
				sawCheckpoints = true
				if got.Name != want.DirName || got.Step != want.Step || got.Epoch != want.Epoch {
					t.Errorf("checkpoint %d: discovery %s step %d epoch %g; trainer %s step %d epoch %g", i, got.Name, got.Step, got.Epoch, want.DirName, want.Step, want.Epoch)
				}
				// The tree was copied from where the trainer wrote it: compare
				// the path below the experiment folder.
				if suffix := want.ModelPath[strings.Index(want.ModelPath, "/"+exp+"/")+1:]; !strings.HasSuffix(filepath.ToSlash(got.URI), suffix) {
					t.Errorf("checkpoint %d: discovery URI %s, trainer %s", i, got.URI, want.ModelPath)
				}
				for k, v := range want.Metrics {
					f, isNumber := v.(float64)
					if !isNumber {
						continue // discovery keeps numbers only
					}
					if gv, ok := got.Metrics[k]; !ok || gv != f {
						t.Errorf("checkpoint %d metric %s: discovery %v, trainer %v", i, k, gv, f)
					}
				}
			}
			// The best checkpoint is the one with the lowest loss on the
			// held-out rows, which the trainer evaluates every checkpoint on.
			if len(complete) > 0 {
				low := complete[0]
				for _, c := range complete {
					if c.Metrics["eval_loss"] < low.Metrics["eval_loss"] {
						low = c
					}
				}
				if _, ok := low.Metrics["eval_loss"]; !ok || res.BestBy != "eval_loss" || res.Best == nil || res.Best.Name != low.Name {
					t.Errorf("best: %v by %q; want %s by eval_loss (metrics %v)", res.Best, res.BestBy, low.Name, low.Metrics)
				}
			}
			if m.LatestCheckpoint != nil && (res.Latest == nil || !strings.HasSuffix(*m.LatestCheckpoint, res.Latest.Name) && !strings.HasSuffix(*m.LatestCheckpoint, res.Latest.Name+"/checkpoint")) {
				t.Errorf("latest: discovery %v, trainer %s", res.Latest, *m.LatestCheckpoint)
			}
		})
	}
	if !sawCheckpoints {
		t.Error("no experiment in the layout has a checkpoint")
	}
}

// TestMarkReaderFollowsTheSchema: every field the pipeline reads from a
// mark (checkpoints.Mark, its data and samples) is one schemas/mark.v1.json
// defines, so a field renamed on one side fails here, not in a run.
func TestMarkReaderFollowsTheSchema(t *testing.T) {
	for _, c := range []struct {
		path []string
		typ  reflect.Type
	}{
		{nil, reflect.TypeFor[checkpoints.Mark]()},
		{[]string{"data"}, reflect.TypeFor[checkpoints.DataStats]()},
		{[]string{"samples"}, reflect.TypeFor[checkpoints.Samples]()},
	} {
		props, err := schemas.MarkProperties(c.path...)
		if err != nil {
			t.Fatal(err)
		}
		for i := range c.typ.NumField() {
			name, _, _ := strings.Cut(c.typ.Field(i).Tag.Get("json"), ",")
			if name != "" && name != "-" && !props[name] {
				t.Errorf("%s.%s reads %q, which the mark schema does not define at %v", c.typ.Name(), c.typ.Field(i).Name, name, c.path)
			}
		}
	}
}
