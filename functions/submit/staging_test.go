package submit

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cloudevents/sdk-go/v2/event"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/pipeline"
	"github.com/raydrop/raydrop/pkg/pipeline/pipelinetest"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/weights"
)

const commit = "0123456789abcdef0123456789abcdef01234567"

// hub answers /api/models/<repo>/revision/<rev> for one repository, as the
// Hugging Face Hub does, and counts the questions.
func hub(t *testing.T, repo string) (*httptest.Server, *atomic.Int32) {
	asked := &atomic.Int32{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked.Add(1)
		switch r.URL.Path {
		case "/api/models/" + repo + "/revision/main", "/api/models/" + repo + "/revision/" + commit:
			fmt.Fprintf(w, `{"id":%q,"sha":%q,"siblings":[{"rfilename":"config.json"}]}`, repo, commit)
		case "/" + repo + "/resolve/" + commit + "/config.json":
			if r.Header.Get("Authorization") != "Bearer hf_accepted" {
				w.Header().Set("X-Error-Message", "Access to model "+repo+" is restricted. You must have access to it and be authenticated to access it. Please log in.")
				w.WriteHeader(http.StatusUnauthorized)
			}
		default:
			http.Error(w, `{"error":"Repository Not Found"}`, http.StatusNotFound)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, asked
}

// stagingWorld is a world whose deployment stages models in the output
// bucket, with the Hub answering for google/gemma-3-4b-it.
func stagingWorld(t *testing.T) (*pipelinetest.World, *atomic.Int32) {
	w := pipelinetest.New(t)
	srv, asked := hub(t, "google/gemma-3-4b-it")
	w.Deps.Config.ModelStaging = "gs://" + pipelinetest.Output + "/models"
	w.Deps.Config.HubEndpoint = srv.URL
	w.Deps.Config.HubToken = "hf_accepted" // an account that accepted the gated model's terms
	return w, asked
}

// submitted delivers run's provisioned message and returns its record and
// its RayJob's entrypoint.
func submitted(t *testing.T, w *pipelinetest.World, run string) (*runs.Record, string) {
	t.Helper()
	e := w.StepEvent(w.Deps.Config.Topics.Provisioned, pipeline.Step{RunID: run, Attempt: 1})
	if err := (&Handler{Deps: w.Deps}).Handle(w.Ctx, e); err != nil {
		t.Fatalf("%s: %v", run, err)
	}
	return w.Record(run), entrypoint(t, w, run)
}

// entrypoint is the entrypoint of run's first attempt's RayJob.
func entrypoint(t *testing.T, w *pipelinetest.World, run string) string {
	t.Helper()
	j, err := w.Ray.RayV1().RayJobs("default").Get(w.Ctx, names.RayJob(run, 1), metav1.GetOptions{})
	if err != nil {
		t.Fatalf("%s: %v", run, err)
	}
	return j.Spec.Entrypoint
}

// TestRunsSubmittedTogetherStageOnce: of several runs of one model
// submitted at once, exactly one is told to stage it; the others wait for
// its copy. All train from the one commit the Hub named, and record who
// stages it.
func TestRunsSubmittedTogetherStageOnce(t *testing.T) {
	w, _ := stagingWorld(t)
	ids := []string{"run-a", "run-b", "run-c", "run-d"}
	for _, id := range ids {
		w.NewRun(id, w.Spec(func(m map[string]any) { m["cluster"].(map[string]any)["name"] = "c-" + id }), runs.Provisioned, runs.Ending{})
	}
	// The messages are made first (the world's message counter is not
	// shared across goroutines), then delivered at once.
	var evs []event.Event
	for _, id := range ids {
		evs = append(evs, w.StepEvent(w.Deps.Config.Topics.Provisioned, pipeline.Step{RunID: id, Attempt: 1}))
	}
	errs := make([]error, len(ids))
	var wg sync.WaitGroup
	for i := range ids {
		wg.Go(func() { errs[i] = (&Handler{Deps: w.Deps}).Handle(w.Ctx, evs[i]) })
	}
	wg.Wait()
	entries := make([]string, len(ids))
	recs := make([]*runs.Record, len(ids))
	for i, id := range ids {
		if errs[i] != nil {
			t.Fatalf("%s: %v", id, errs[i])
		}
		recs[i], entries[i] = w.Record(id), entrypoint(t, w, id)
	}
	stagers := 0
	for i, id := range ids {
		m := recs[i].Model
		if m == nil || m.Commit != commit || m.URI != "gs://"+pipelinetest.Output+"/models/google/gemma-3-4b-it/"+commit || m.Staged {
			t.Fatalf("%s recorded model %+v", id, m)
		}
		if m.StagedBy != recs[0].Model.StagedBy {
			t.Errorf("%s says %s stages the model, %s says %s", id, m.StagedBy, ids[0], recs[0].Model.StagedBy)
		}
		if !strings.Contains(entries[i], "--staged-model "+m.URI+" --model-revision "+commit) {
			t.Errorf("%s's entrypoint does not read the staged model: %s", id, entries[i])
		}
		if strings.Contains(entries[i], "--stage-model true") {
			stagers++
			if m.StagedBy != id {
				t.Errorf("%s stages the model, but the lease names %s", id, m.StagedBy)
			}
		}
	}
	if stagers != 1 {
		t.Errorf("%d runs told to stage the model, want 1", stagers)
	}
}

// TestStagedModelIsRead: once the marker is in the bucket, a run reads the
// copy and stages nothing; a retry attempt trains from the commit the run
// pinned without asking the Hub again.
func TestStagedModelIsRead(t *testing.T) {
	w, asked := stagingWorld(t)
	loc, _ := weights.At(w.Deps.Config.ModelStaging, "google/gemma-3-4b-it", commit)
	mk, _ := json.Marshal(weights.Marker{Repo: "google/gemma-3-4b-it", Commit: commit, StagedBy: "run-0", Files: []weights.File{{Path: "config.json", Size: 2}}})
	w.Write(pipelinetest.Output, loc.Object(weights.MarkerName), string(mk))
	w.NewRun("run-1", w.Spec(nil), runs.Provisioned, runs.Ending{})
	rec, entry := submitted(t, w, "run-1")
	if m := rec.Model; m == nil || !m.Staged || m.StagedBy != "run-0" || !strings.Contains(entry, "--stage-model false") {
		t.Errorf("model %+v, entrypoint %s: want the staged copy read", m, entry)
	}
	if asked.Load() != 1 {
		t.Errorf("the Hub was asked %d times, want 1", asked.Load())
	}
	// A spec pinning the staged commit needs nothing of the Hub.
	w.NewRun("run-2", w.Spec(func(m map[string]any) {
		m["cluster"].(map[string]any)["name"] = "c-2"
		m["model"] = map[string]any{"id": "google/gemma-3-4b-it", "revision": commit}
	}), runs.Provisioned, runs.Ending{})
	if rec, _ := submitted(t, w, "run-2"); rec.Model == nil || !rec.Model.Staged || asked.Load() != 1 {
		t.Errorf("a pinned, staged commit: model %+v, the Hub asked %d times (want still 1)", rec.Model, asked.Load())
	}
	again := w.Record("run-1")
	again.Phase, again.Attempt = runs.Provisioned, 2
	if got, err := w.Deps.StageModel(w.Ctx, again); err != nil || got.Commit != commit {
		t.Fatalf("attempt 2: %+v %v", got, err)
	}
	if asked.Load() != 1 {
		t.Errorf("attempt 2 asked the Hub again (%d questions): the commit is pinned", asked.Load())
	}
}

// TestStagingTakenOverFromAnEndedRun: a run that held the staging lease and
// ended without a marker leaves it to the next run.
func TestStagingTakenOverFromAnEndedRun(t *testing.T) {
	w, _ := stagingWorld(t)
	w.NewRun("run-1", w.Spec(func(m map[string]any) { m["cluster"].(map[string]any)["name"] = "c-1" }), runs.Provisioned, runs.Ending{})
	w.NewRun("run-2", w.Spec(func(m map[string]any) { m["cluster"].(map[string]any)["name"] = "c-2" }), runs.Provisioned, runs.Ending{})
	if _, entry := submitted(t, w, "run-1"); !strings.Contains(entry, "--stage-model true") {
		t.Fatalf("run-1 does not stage: %s", entry)
	}
	// run-1 fails before its copy is done (the world's state: ended).
	if _, err := w.Runs.Update(w.Ctx, "run-1", func(r *runs.Record) error { r.Phase = runs.Failed; return nil }); err != nil {
		t.Fatal(err)
	}
	if rec, entry := submitted(t, w, "run-2"); !strings.Contains(entry, "--stage-model true") || rec.Model.StagedBy != "run-2" {
		t.Errorf("run-2 did not take the staging over: %+v %s", rec.Model, entry)
	}
}

// TestUnknownModelFailsTheRun: a model the Hub does not have, or a gated
// one whose files it refuses the deployment's token, fails the run
// (InvalidModel, naming model.id and the Hub's answer) instead of being
// retried, and no RayJob is created.
func TestUnknownModelFailsTheRun(t *testing.T) {
	for _, c := range []struct {
		name, model, token string
		want               []string
	}{
		{"no such model", "google/no-such-model", "hf_accepted", []string{`model.id "google/no-such-model"`, "HTTP 404"}},
		{"gated, terms not accepted", "google/gemma-3-4b-it", "hf_other", []string{`model.id "google/gemma-3-4b-it"`, "refuses the deployment's Hub token", "HTTP 401", "is restricted"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w, _ := stagingWorld(t)
			w.Deps.Config.HubToken = c.token
			w.NewRun("run-1", w.Spec(func(m map[string]any) { m["model"] = map[string]any{"id": c.model} }), runs.Provisioned, runs.Ending{})
			e := w.StepEvent(w.Deps.Config.Topics.Provisioned, pipeline.Step{RunID: "run-1", Attempt: 1})
			if err := (&Handler{Deps: w.Deps}).Handle(w.Ctx, e); err != nil {
				t.Fatal(err)
			}
			r := w.Record("run-1")
			for _, want := range c.want {
				if r.Reason != runs.InvalidModel || !strings.Contains(r.Message, want) {
					t.Errorf("record %s (%s): %s; want InvalidModel saying %q", r.Phase, r.Reason, r.Message, want)
				}
			}
			if jobs, _ := w.Ray.RayV1().RayJobs("default").List(w.Ctx, metav1.ListOptions{}); len(jobs.Items) != 0 {
				t.Errorf("%d RayJobs created for a model the Hub refuses", len(jobs.Items))
			}
		})
	}
}

// TestDataCheckStagesTheModel: a checked run's data check stages the
// model on the head (before any GPU worker), and the commit is pinned in
// the record then: its first attempt reads the copy without asking the
// Hub again.
func TestDataCheckStagesTheModel(t *testing.T) {
	w, asked := stagingWorld(t)
	r := w.NewRun("run-1", w.Spec(func(m map[string]any) { m["dataset"] = map[string]any{"check": true} }), runs.Accepted, runs.Ending{})
	if _, err := w.Deps.Runs.Update(w.Ctx, r.RunID, func(r *runs.Record) error {
		return r.MarkChecking(names.RayJob("run-1", manifests.CheckAttempt), w.Now)
	}); err != nil {
		t.Fatal(err)
	}
	e := w.StepEvent(w.Deps.Config.Topics.Provisioned, pipeline.Step{RunID: "run-1", Attempt: manifests.CheckAttempt})
	if err := (&Handler{Deps: w.Deps}).Handle(w.Ctx, e); err != nil {
		t.Fatal(err)
	}
	j, err := w.Ray.RayV1().RayJobs("default").Get(w.Ctx, names.RayJob("run-1", manifests.CheckAttempt), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(j.Spec.Entrypoint, "datacheck.py") || !strings.Contains(j.Spec.Entrypoint, "--stage-model true") {
		t.Errorf("the data check does not stage the model: %s", j.Spec.Entrypoint)
	}
	rec := w.Record("run-1")
	if m := rec.Model; m == nil || m.Commit != commit || m.StagedBy != "run-1" || rec.Phase != runs.Checking {
		t.Fatalf("record %s, model %+v", rec.Phase, m)
	}
	rec.Phase, rec.Attempt = runs.Provisioned, 1
	// The check asked the Hub twice: the commit, and whether the token may
	// read its files.
	if m, err := w.Deps.StageModel(w.Ctx, rec); err != nil || m.Commit != commit || asked.Load() != 2 {
		t.Errorf("attempt 1: %+v %v, the Hub asked %d times (want the check's 2 only)", m, err, asked.Load())
	}
}
