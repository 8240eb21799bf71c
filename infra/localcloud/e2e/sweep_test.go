package e2e_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"fmt"

	"github.com/chromedp/chromedp"
	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/report"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// sweepOf is the example spec as a sweep over clusters, with sweep's
// fields.
func sweepOf(t *testing.T, clusters []string, sweep map[string]any) []byte {
	t.Helper()
	sweep["clusters"] = clusters
	return specFor(t, clusters[0], map[string]any{"sweep": sweep})
}

// waitSweep polls the sweep's record until it has ended and its event
// has gone out.
func waitSweep(t *testing.T, id string, limit time.Duration) *sweeps.Record {
	t.Helper()
	store := &sweeps.Store{Bucket: st.GCS.Bucket(stack.StateBucket)}
	deadline := time.Now().Add(limit)
	var last *sweeps.Record
	for time.Now().Before(deadline) {
		sw, err := store.Get(context.Background(), id)
		if err == nil {
			last = sw
			if sw.Phase.Terminal() && sw.Published {
				return sw
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("sweep %s did not end within %s: %+v", id, limit, last)
	return nil
}

// sweepEvent waits for the sweep's one event, validates it against its
// schema and returns its data; a second one fails the test.
func sweepEvent(t *testing.T, id string) events.Sweep {
	t.Helper()
	deadline := time.Now().Add(40 * time.Second)
	for len(evs.OfSweep(id)) == 0 && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
	}
	time.Sleep(3 * time.Second) // a copy would have arrived by now
	seen := evs.OfSweep(id)
	if len(seen) != 1 {
		t.Fatalf("%d events of sweep %s, want 1", len(seen), id)
	}
	var d events.Sweep
	if err := json.Unmarshal(seen[0].Raw, &d); err != nil {
		t.Fatal(err)
	}
	// Kept for the docs' example: the event as the bus delivered it.
	if err := os.MkdirAll(reportDir, 0o755); err == nil {
		var pretty bytes.Buffer
		if json.Indent(&pretty, seen[0].Raw, "", "  ") == nil {
			_ = os.WriteFile(filepath.Join(reportDir, "sweep-"+d.Phase+".json"), pretty.Bytes(), 0o644)
		}
	}
	file := "../../../schemas/events/" + events.SweepType(d.Phase) + ".json"
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	doc, _ := jsonschema.UnmarshalJSON(bytes.NewReader(b))
	if err := c.AddResource(file, doc); err != nil {
		t.Fatal(err)
	}
	sch, err := c.Compile(file)
	if err != nil {
		t.Fatal(err)
	}
	inst, _ := jsonschema.UnmarshalJSON(bytes.NewReader(seen[0].Raw))
	if err := sch.Validate(inst); err != nil {
		t.Errorf("the sweep's event does not match %s: %v", file, err)
	}
	return d
}

// TestSweepStopsEarlyAndNamesTheBest drops a 6-trial grid (three learning
// rates by two LoRA ranks) over two clusters with the median rule, twice
// (the upload's event delivered again): one sweep, two trials at a time,
// the trials whose held-out loss trails the median stopped early (STOPPED,
// EarlyStopped), the sweep's one event naming the best trial by held-out
// loss, its report in a real Chromium, and every worker at zero. The
// simulated trainer's losses follow the learning rate and the rank (the
// defaults' 2e-4 and 16 reach the lowest floor; 1e-3 falls fastest, so it
// leads at every checkpoint of a run this short), and the grid runs the
// fast rate first, so the slower trials after it trail.
func TestSweepStopsEarlyAndNamesTheBest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clusters := []string{"e2e-sweep-a", "e2e-sweep-b"}
	data := sweepOf(t, clusters, map[string]any{
		"parameters": []any{
			map[string]any{"path": "training.learningRate", "values": []float64{1e-3, 2e-4, 5e-5}},
			map[string]any{"path": "lora.r", "values": []int{16, 8}},
		},
		"earlyStopping": map[string]any{"rule": "median", "minTrials": 2},
	})
	name := "jobs/sweep-lr-rank.json"
	id, gen, err := probe.UploadObject(ctx, st, "sweep-lr-rank", data, "steps=4,step=1500ms")
	if err != nil {
		t.Fatal(err)
	}
	pub := st.PS.Publisher(stack.NotifyTopic)
	defer pub.Stop()
	if _, err := pub.Publish(ctx, probe.Notification(name, gen, len(data))).Get(ctx); err != nil {
		t.Fatal(err)
	}

	sw := waitSweep(t, id, 6*time.Minute)
	if sw.Phase != sweeps.Succeeded || len(sw.Trials) != 6 {
		t.Fatalf("sweep %s with %d trials: %s", sw.Phase, len(sw.Trials), sw.Message)
	}
	stopped := 0
	for _, tr := range sw.Trials {
		r := waitPhase(t, tr.RunID, 30*time.Second, runs.Succeeded, runs.Stopped, runs.Failed, runs.Cancelled)
		if r.Trial == nil || r.Trial.SweepID != id || r.Trial.Index != tr.Index {
			t.Errorf("trial %d's run names %+v", tr.Index, r.Trial)
		}
		switch r.Phase {
		case runs.Stopped:
			stopped++
			if r.Reason != runs.EarlyStopped || r.Result == nil || len(r.Result.Checkpoints) == 0 {
				t.Errorf("trial %d stopped %s without its checkpoints: %+v", tr.Index, r.Reason, r.Result)
			}
		case runs.Succeeded:
		default:
			t.Errorf("trial %d ended %s (%s)", tr.Index, r.Phase, r.Message)
		}
		if n := terminalEvents(eventsOf(t, tr.RunID)); n != 1 {
			t.Errorf("trial %d has %d terminal events", tr.Index, n)
		}
		if n := rayJobsOf(t, tr.RunID); n > 1 {
			t.Errorf("trial %d has %d RayJobs", tr.Index, n)
		}
	}
	if stopped == 0 {
		t.Error("no trial was stopped early")
	}
	d := sweepEvent(t, id)
	if d.Best == nil || d.Best.Index != 1 || d.Best.BestCheckpoint == "" || d.StoppedEarly != stopped {
		t.Errorf("the sweep's event: best %+v, stopped early %d (records: %d)", d.Best, d.StoppedEarly, stopped)
	}
	for _, c := range clusters {
		waitNoWorkers(t, c)
	}
	// What the median rule saved: the GPU-hours of the stopped trials
	// against the same trials run to their end (as the trials of their
	// learning rate that ran to the end used).
	var used, full float64
	for _, tr := range d.Trials {
		used += tr.GPUHours
		full += tr.GPUHours
		if tr.Outcome == "stopped" {
			full += tr.GPUHours * (12.0/float64(max(tr.Steps, 1)) - 1)
		}
	}
	t.Logf("sweep %s: %d of 6 trials stopped early; %.4f GPU-hours used, about %.4f had every trial run its 12 steps (%.0f%% saved)", id, stopped, used, full, 100*(1-used/full))

	if chromium := os.Getenv("RAYDROP_CHROMIUM"); chromium != "" {
		showSweepReport(t, sw, d, chromium)
	}
}

// showSweepReport opens the sweep's report in Chromium: a row per trial,
// the best marked, a held-out curve per trial that reported one, a dashed
// one per stopped trial, and nothing fetched. It leaves the page and a
// screenshot in .build/report/.
func showSweepReport(t *testing.T, sw *sweeps.Record, d events.Sweep, chromium string) {
	t.Helper()
	if sw.Report == "" || d.Report != sw.Report || sw.Report != report.SweepURI(sw) {
		t.Fatalf("report %q in the record, %q in the event; want %s", sw.Report, d.Report, report.SweepURI(sw))
	}
	bucket, name := report.SweepObject(sw)
	rd, err := st.GCS.Bucket(bucket).Object(name).NewReader(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(rd)
	_ = rd.Close()
	if err != nil {
		t.Fatal(err)
	}
	page, _ := filepath.Abs(filepath.Join(reportDir, "sweep.html"))
	if err := os.MkdirAll(filepath.Dir(page), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(page, b, 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	actx, acancel := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1200, 900))...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	type shown struct {
		Rows    int    `json:"rows"`
		Best    string `json:"best"`
		Lines   int    `json:"lines"`
		Dashed  int    `json:"dashed"`
		Stopped int    `json:"stopped"`
	}
	if err := chromedp.Do(bctx, chromedp.Navigate("file://"+page), chromedp.WaitReady("#trials")); err != nil {
		t.Fatalf("open %s: %v", page, err)
	}
	seen, err := chromedp.Run(bctx, chromedp.Evaluate[shown](`(() => ({
		rows: document.querySelectorAll("#trials tr[data-trial]").length,
		best: (document.querySelector("#trials tr.best") || {dataset: {}}).dataset.trial || "",
		lines: document.querySelectorAll("#curves path.line").length,
		dashed: document.querySelectorAll("#curves path.line.stopped").length,
		stopped: document.querySelectorAll("#trials tr[data-outcome=stopped]").length,
	}))()`))
	if err != nil {
		t.Fatal(err)
	}
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err == nil {
		_ = os.WriteFile(filepath.Join(reportDir, "sweep.png"), shot, 0o644)
	}
	if seen.Rows != 6 || seen.Best != "1" || seen.Lines != 6 || seen.Dashed != d.StoppedEarly || seen.Stopped != d.StoppedEarly {
		t.Errorf("the report shows %+v; want 6 rows, best 1, 6 curves, %d dashed and stopped", seen, d.StoppedEarly)
	}
	if !strings.Contains(string(b), sw.SweepID) {
		t.Error("the report does not name its sweep")
	}
}

// TestSweepCancelled cancels a sweep while its first trials run: they end
// CANCELLED once each, no other trial starts, the sweep ends cancelled with
// one event, and the workers go to zero.
func TestSweepCancelled(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	clusters := []string{"e2e-sweep-cancel-a", "e2e-sweep-cancel-b"}
	data := sweepOf(t, clusters, map[string]any{
		"parameters": []any{map[string]any{"path": "training.learningRate", "values": []float64{1e-4, 2e-4, 4e-4, 8e-4}}},
	})
	id := upload(t, "sweep-cancel", data, "steps=20,step=500ms")
	first := sweeps.TrialRunID(id, 1)
	waitPhase(t, first, 120*time.Second, runs.Running)
	w := st.GCS.Bucket(stack.IntakeBucket).Object("cancel/" + id).NewWriter(ctx)
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	sw := waitSweep(t, id, 3*time.Minute)
	if sw.Phase != sweeps.Cancelled {
		t.Fatalf("sweep %s: %s", sw.Phase, sw.Message)
	}
	for _, tr := range sw.Trials {
		if !tr.Started() {
			continue
		}
		r := waitPhase(t, tr.RunID, 60*time.Second, runs.Cancelled, runs.Succeeded, runs.Failed, runs.Stopped)
		if r.Phase != runs.Cancelled {
			t.Errorf("trial %d ended %s", tr.Index, r.Phase)
		}
		if n := terminalEvents(eventsOf(t, tr.RunID)); n != 1 {
			t.Errorf("trial %d has %d terminal events", tr.Index, n)
		}
	}
	for _, i := range []int{3, 4} {
		if sw.Trials[i-1].Started() {
			t.Errorf("trial %d started after the cancellation", i)
		}
	}
	if d := sweepEvent(t, id); d.Phase != "cancelled" {
		t.Errorf("the sweep's event says %s", d.Phase)
	}
	for _, c := range clusters {
		waitNoWorkers(t, c)
	}
}

// TestSweepCLI drives a sweep through the raydrop command: submit prints
// the sweep's ID, events --sweep follows its event, watch follows its
// trials to the end and names the best, status, list --sweeps and report
// show it, and cancel refuses a sweep that has ended.
func TestSweepCLI(t *testing.T) {
	t.Parallel()
	file := t.TempDir() + "/cli-sweep.json"
	data := sweepOf(t, []string{"e2e-sweep-cli"}, map[string]any{
		"parameters": []any{map[string]any{"path": "lora.r", "values": []int{8, 16}}},
	})
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := raydrop("submit", file)
	if code != 0 || !strings.Contains(errOut, "2 trials, 1 at once") {
		t.Fatalf("submit: exit %d: %s %s", code, out, errOut)
	}
	id := strings.TrimSpace(out)
	evDone := make(chan string, 1)
	go func() {
		code, out, errOut := raydrop("events", "--json", "--sweep", id, "--type", events.SweepType("succeeded"), "--count", "1")
		evDone <- fmt.Sprintf("%d\n%s\n%s", code, out, errOut)
	}()
	code, out, errOut = raydrop("watch", id, "--interval", "300ms")
	if code != 0 || !strings.Contains(out, "sweep "+id+" SUCCEEDED") || !strings.Contains(out, "best       trial 2") || strings.Count(out, " started on e2e-sweep-cli") != 2 {
		t.Fatalf("watch: exit %d\n%s\n%s", code, out, errOut)
	}
	if code, out, _ := raydrop("status", id); code != 0 || !strings.Contains(out, "lora.r=16") || !strings.Contains(out, "best") {
		t.Errorf("status: exit %d\n%s", code, out)
	}
	code, out, _ = raydrop("status", id, "--json")
	var sw sweeps.Record
	if code != 0 || json.Unmarshal([]byte(out), &sw) != nil || sw.SweepID != id || sw.Best != 2 {
		t.Errorf("status --json: exit %d\n%s", code, out)
	}
	if code, out, _ := raydrop("list", "--sweeps", "--json"); code != 0 || !strings.Contains(out, `"sweepId": "`+id+`"`) {
		t.Errorf("list --sweeps: exit %d\n%s", code, out)
	}
	if code, out, _ := raydrop("report", id); code != 0 || strings.TrimSpace(out) != sw.Report || sw.Report == "" {
		t.Errorf("report: exit %d %q (record %q)", code, out, sw.Report)
	}
	page := t.TempDir() + "/sweep.html"
	if code, _, errOut := raydrop("report", id, "-o", page); code != 0 {
		t.Errorf("report -o: exit %d %s", code, errOut)
	} else if b, err := os.ReadFile(page); err != nil || !bytes.Contains(b, []byte(id)) {
		t.Errorf("report -o wrote %d bytes (%v) without the sweep", len(b), err)
	}
	if code, _, errOut := raydrop("cancel", id); code != 1 || !strings.Contains(errOut, "has already ended SUCCEEDED") {
		t.Errorf("cancel of an ended sweep: exit %d %s", code, errOut)
	}
	select {
	case got := <-evDone:
		code, out, _ := strings.Cut(got, "\n")
		if code != "0" || !strings.Contains(out, `"type":"`+events.SweepType("succeeded")+`"`) || !strings.Contains(out, `"subject":"sweeps/`+id+`"`) {
			t.Errorf("events --sweep: %s", got)
		}
	case <-time.After(60 * time.Second):
		t.Error("events --sweep printed nothing")
	}
}
