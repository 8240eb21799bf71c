package spec_test

import (
	"math"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/raydrop/raydrop/pkg/spec"
)

func parseFile(t *testing.T, path string) *spec.JobSpec {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse(b)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func paramsOf(tr spec.Trial) string {
	var out []string
	for _, p := range tr.Params {
		out = append(out, p.String())
	}
	return strings.Join(out, " ")
}

// TestGridTrials: every combination, the last parameter varying fastest,
// whole-number fields as whole numbers; each trial's spec has the values,
// its cluster, and no sweep.
func TestGridTrials(t *testing.T) {
	s := parseFile(t, "testdata/good/sweep-grid.json")
	trials, err := s.Trials()
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, tr := range trials {
		got = append(got, paramsOf(tr))
	}
	want := []string{
		"training.learningRate=0.0001 lora.r=8", "training.learningRate=0.0001 lora.r=16",
		"training.learningRate=0.0002 lora.r=8", "training.learningRate=0.0002 lora.r=16",
		"training.learningRate=0.0004 lora.r=8", "training.learningRate=0.0004 lora.r=16",
	}
	if !slices.Equal(got, want) {
		t.Errorf("grid trials\n%q\nwant\n%q", got, want)
	}
	ts, err := s.TrialSpec(trials[3].Params, "gemma3-b")
	if err != nil {
		t.Fatal(err)
	}
	if ts.Training.LearningRate != 0.0002 || ts.LoRA.R != 16 || ts.Cluster.Name != "gemma3-b" || ts.Swept() || ts.Name != s.Name {
		t.Errorf("trial 4's spec: lr %g, r %d, cluster %s, swept %v, name %s", ts.Training.LearningRate, ts.LoRA.R, ts.Cluster.Name, ts.Swept(), ts.Name)
	}
	// Everything else is the sweep's: the spec's hash differs only by the
	// parameters and the cluster.
	same, _ := s.TrialSpec([]spec.ParamValue{{Path: "training.learningRate", Value: s.Training.LearningRate}, {Path: "lora.r", Value: s.LoRA.R}}, s.Cluster.Name)
	plain := *s
	plain.Sweep = spec.Sweep{}
	if same.Hash() != plain.Hash() {
		t.Error("a trial with the sweep's own values is not the spec without the sweep")
	}
	if got := s.SweepClusters(); !slices.Equal(got, []string{"gemma3-a", "gemma3-b"}) || s.SweepParallel() != 2 {
		t.Errorf("clusters %v, parallel %d", got, s.SweepParallel())
	}
}

// TestRandomTrials: the same seed draws the same trials, each value within
// its range and of its field's type; another seed draws others.
func TestRandomTrials(t *testing.T) {
	s := parseFile(t, "testdata/good/sweep-random.json")
	a, _ := s.Trials()
	b, _ := s.Trials()
	if len(a) != 12 {
		t.Fatalf("%d trials, want 12", len(a))
	}
	for i := range a {
		if paramsOf(a[i]) != paramsOf(b[i]) {
			t.Fatalf("trial %d drawn twice differently: %s, %s", i+1, paramsOf(a[i]), paramsOf(b[i]))
		}
		for _, p := range a[i].Params {
			switch p.Path {
			case "training.learningRate":
				if v := p.Value.(float64); v < 1e-5 || v > 1e-3 {
					t.Errorf("trial %d: learning rate %g outside its range", i+1, v)
				}
			case "lora.dropout":
				if v := p.Value.(float64); v < 0 || v > 0.2 {
					t.Errorf("trial %d: dropout %g outside its range", i+1, v)
				}
			case "training.lrScheduler":
				if v := p.Value.(string); v != "constant" && v != "cosine" {
					t.Errorf("trial %d: scheduler %s", i+1, v)
				}
			case "lora.visionTower":
				if _, ok := p.Value.(bool); !ok {
					t.Errorf("trial %d: visionTower %v is not a boolean", i+1, p.Value)
				}
			}
		}
		if _, err := s.TrialSpec(a[i].Params, s.Cluster.Name); err != nil {
			t.Errorf("trial %d (%s): %v", i+1, paramsOf(a[i]), err)
		}
	}
	// Log-uniform: about half the draws below the range's geometric middle.
	below := 0
	for _, tr := range a {
		if tr.Params[0].Value.(float64) < math.Sqrt(1e-5*1e-3) {
			below++
		}
	}
	if below == 0 || below == len(a) {
		t.Errorf("%d of %d log-uniform draws below the geometric middle", below, len(a))
	}
	s.Sweep.Seed = 8
	c, _ := s.Trials()
	if paramsOf(c[0]) == paramsOf(a[0]) && paramsOf(c[1]) == paramsOf(a[1]) {
		t.Error("another seed drew the same trials")
	}
}

// TestSweepPaths: the fields a sweep may vary come from the spec's types;
// those that would make trials incomparable or change the cluster are
// left out.
func TestSweepPaths(t *testing.T) {
	paths := spec.SweepPaths()
	for _, p := range []string{"training.learningRate", "lora.r", "lora.dropout", "training.lrScheduler", "lora.visionTower", "dataset.sampleAnswers"} {
		if !slices.Contains(paths, p) {
			t.Errorf("%s may not be swept", p)
		}
	}
	for _, p := range []string{"dataset.evalShare", "dataset.split", "dataset.check", "dataset.format", "training.workers", "model.id", "cluster.name", "dataset.template.prompt"} {
		if slices.Contains(paths, p) {
			t.Errorf("%s may be swept", p)
		}
	}
}
