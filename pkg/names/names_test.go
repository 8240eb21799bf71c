package names_test

import (
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/spec"
)

func TestRunIDFromObject(t *testing.T) {
	a := names.RunIDFromObject("b", "jobs/Gemma3 Vision!.json", 1)
	if a != names.RunIDFromObject("b", "jobs/Gemma3 Vision!.json", 1) {
		t.Error("same object generation gave two run IDs")
	}
	if a == names.RunIDFromObject("b", "jobs/Gemma3 Vision!.json", 2) {
		t.Error("a new generation gave the same run ID")
	}
	if !strings.HasPrefix(a, "gemma3-vision-") {
		t.Errorf("run ID %q does not start with the object's name", a)
	}
}

// TestRunIDsAreValid checks that every derived run ID is a valid run ID and
// yields Kubernetes names within KubeRay's limits, for hostile object names.
func TestRunIDsAreValid(t *testing.T) {
	objects := []string{"jobs/x.json", "jobs/.json", "jobs/123.json", "jobs/" + strings.Repeat("A", 300) + ".json", "jobs/../../etc/passwd", "jobs/日本語.json", "jobs/--.json", "jobs/a\x00b.json"}
	var ids []string
	for _, o := range objects {
		ids = append(ids, names.RunIDFromObject("bucket", o, 7))
	}
	ids = append(ids, names.RunIDFromMessage("projects/p/topics/t", "1234567890"), names.RunIDFromFile("x/y.json", []byte("{}")))
	for _, id := range ids {
		if msg := spec.CheckRunID(id); msg != "" {
			t.Errorf("run ID %q: %s", id, msg)
		}
		job := names.RayJob(id, 11)
		if len(job) > 47 || len(validation.IsDNS1035Label(job)) > 0 && len(validation.IsDNS1123Label(job)) > 0 {
			t.Errorf("RayJob name %q is not valid for KubeRay", job)
		}
	}
}

func TestSpecName(t *testing.T) {
	for in, want := range map[string]string{"jobs/My Job.json": "my-job", "jobs/.json": "job", "jobs/9lives.json": "j9lives"} {
		if got := names.SpecName(in); got != want {
			t.Errorf("SpecName(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestMarkNotice(t *testing.T) {
	if got := names.MarkNotice("run-1", 2); got != "raydrop-marks/run-1/attempt-2.json" {
		t.Errorf("MarkNotice: %s", got)
	}
	if id, ok := names.RunOfNotice(names.MarkNotice("run-1", 2)); !ok || id != "run-1" {
		t.Errorf("RunOfNotice: %q %v", id, ok)
	}
	for _, bad := range []string{"raydrop-marks/run-1/attempt-0.json", "raydrop-marks/run-1/x.json", "raydrop-marks//attempt-1.json",
		"raydrop-marks/run-1/a/attempt-1.json", "other/run-1/attempt-1.json", "raydrop-marks/run-1/attempt-1.json.tmp", "raydrop-marks/run-1"} {
		if id, ok := names.RunOfNotice(bad); ok {
			t.Errorf("names.RunOfNotice(%q) = %q", bad, id)
		}
	}
}
