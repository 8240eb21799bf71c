package kubesim

import (
	"os"
	"reflect"
	"testing"

	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/spec"
)

func TestParseEntrypoint(t *testing.T) {
	data, err := os.ReadFile("../../../examples/gemma3-vision.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	s.Training.MaxSteps = 30
	resume := "gs://my-project-raydrop-checkpoints/raydrop/r-1/attempt-1/TorchTrainer_1a2b3_00000_0_2026-11-30_10-00-00/checkpoint_000001/checkpoint"
	run := manifests.Run{ID: "r-1", Attempt: 2, ResumeFrom: resume}
	a, err := parseEntrypoint(manifests.Entrypoint(s, run))
	if err != nil {
		t.Fatal(err)
	}
	want := manifests.TrainerArgs(s, run)[1:]
	got := map[string]string{}
	for i := 0; i < len(want); i += 2 {
		got[want[i][2:]] = want[i+1]
	}
	if !reflect.DeepEqual(a.all, got) {
		t.Errorf("flags\n got %v\nwant %v", a.all, got)
	}
	if a.runID != "r-1" || a.bucket != "my-project-raydrop-checkpoints" || a.prefix != "raydrop/r-1" ||
		a.experiment != "attempt-2" || a.epochs != 3 || a.maxSteps != 30 || a.resumeFrom != resume ||
		a.experimentName() != "raydrop/r-1/attempt-2" {
		t.Errorf("parsed %+v", a)
	}

	for _, bad := range []string{
		"python /code/train.py --run-id x",                             // no storage path
		"python /code/train.py --storage-path /tmp/x",                  // not gs://
		"python /code/train.py --storage-path gs://b/p --epochs three", // not a number
		"python /code/train.py --storage-path gs://b/p --epochs",       // no value
		"python other.py --storage-path gs://b/p",
		"python /code/train.py --storage-path 'gs://b/p",
	} {
		if _, err := parseEntrypoint(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

func TestSplitWords(t *testing.T) {
	got, err := splitWords(`python  'a b' "c \"d\"" e\ f 'it'\''s' ''`)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"python", "a b", `c "d"`, "e f", "it's", ""}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %q, want %q", got, want)
	}
}
