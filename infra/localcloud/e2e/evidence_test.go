package e2e_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/pkg/cause"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/report"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/schemas"
)

// checkEvidence reads a run's evidence folder as a person would a day
// later, from its bucket alone: the record and the terminal event point
// at it, its last attempt's manifest is complete and true to the files,
// the pods' statuses and events are there, and the submitter's log (the
// driver's output) holds want.
func checkEvidence(t *testing.T, r *runs.Record, evs []probe.Seen, want string) {
	t.Helper()
	ctx := context.Background()
	r, err := probe.Runs(st).Get(ctx, r.RunID)
	if err != nil {
		t.Fatal(err)
	}
	bucket, attempt, err := evidence.Locate(r.Evidence, r.Attempt)
	if err != nil || !strings.HasSuffix(r.Evidence, "/"+r.RunID+"/evidence/") {
		t.Fatalf("the record's evidence folder %q (%v), want gs://<bucket>/.../%s/evidence/", r.Evidence, err, r.RunID)
	}
	for _, e := range evs {
		if runs.Phase(strings.ToUpper(e.Phase)).Terminal() && e.Evidence != r.Evidence {
			t.Errorf("the %s event's evidence %q, the record's %q", e.Phase, e.Evidence, r.Evidence)
		}
	}
	read := func(name string) []byte {
		t.Helper()
		rd, err := st.GCS.Bucket(bucket).Object(name).NewReader(ctx)
		if err != nil {
			t.Fatalf("gs://%s/%s: %v", bucket, name, err)
		}
		defer func() { _ = rd.Close() }()
		b, err := io.ReadAll(rd)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	doc := read(attempt + "/" + evidence.ManifestFile)
	if err := schemas.ValidateEvidence(doc); err != nil {
		t.Fatalf("manifest breaks its schema: %v\n%s", err, doc)
	}
	var m evidence.Manifest
	if err := json.Unmarshal(doc, &m); err != nil {
		t.Fatal(err)
	}
	if !m.Complete || m.RunID != r.RunID || m.Attempt != r.Attempt {
		t.Errorf("manifest of %s attempt %d: %+v", m.RunID, m.Attempt, m)
	}
	var submitter string
	for _, f := range m.Files {
		// Every file listed exists; its size is known to the manifest
		// unless another capture of the attempt (a notice's and a tick's,
		// at once) wrote it first: then bytes is 0 (schemas/evidence.v1.json).
		if got := len(read(attempt + "/" + f.Path)); got != f.Bytes && !f.Earlier {
			t.Errorf("%s: %d bytes, the manifest says %d", f.Path, got, f.Bytes)
		}
		if f.Kind == evidence.KindLog && strings.HasPrefix(f.Pod, m.RayJob+"-") {
			submitter = f.Path
		}
	}
	var pods []evidence.PodRecord
	if err := json.Unmarshal(read(attempt+"/pods.json"), &pods); err != nil || len(pods) < 2 {
		t.Errorf("pods.json: %d pods (%v), want the head, the workers and the submitter", len(pods), err)
	}
	if submitter == "" {
		t.Fatalf("no submitter log in the manifest: %+v", m.Files)
	}
	zr, err := gzip.NewReader(bytes.NewReader(read(attempt + "/" + submitter)))
	if err != nil {
		t.Fatal(err)
	}
	log, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), want) {
		t.Errorf("the submitter's log %s has no %q:\n%s", submitter, want, log)
	}
	// Ray's own logs, copied by the head's raylogs sidecar while it ran:
	// the driver's output and its index.
	var head string
	for _, p := range pods {
		if p.Labels["ray.io/node-type"] == "head" {
			head = p.Name
		}
	}
	ray := attempt + "/" + evidence.RayFolder + "/" + head + "/"
	var index struct {
		Files map[string]struct{ Bytes, Kept int } `json:"files"`
	}
	if err := json.Unmarshal(read(ray+"index.json"), &index); err != nil {
		t.Fatalf("%sindex.json: %v", ray, err)
	}
	driver := "job-driver-" + names.SubmissionID(r.RunID, r.Attempt) + ".log"
	if e, ok := index.Files[driver]; !ok || e.Kept == 0 || len(read(ray+driver)) != e.Kept {
		t.Errorf("the head's Ray logs %s: index %+v, want %s in it and as long as it says", ray, index.Files, driver)
	}
}

// checkCause checks that a run that ended other than succeeded names its
// cause (kind, a summary holding summary) in its record, its terminal
// event and raydrop status.
func checkCause(t *testing.T, runID string, evs []probe.Seen, kind, summary string) {
	t.Helper()
	r, err := probe.Runs(st).Get(context.Background(), runID)
	if err != nil {
		t.Fatal(err)
	}
	if c := r.Cause; c == nil || c.Kind != kind || !strings.Contains(c.Summary, summary) {
		t.Errorf("run %s's cause %+v, want %s with %q", runID, c, kind, summary)
	}
	for _, e := range evs {
		if runs.Phase(strings.ToUpper(e.Phase)).Terminal() && (e.Cause != kind || !strings.Contains(e.Summary, summary)) {
			t.Errorf("the %s event's cause %q summary %q, want %s with %q", e.Phase, e.Cause, e.Summary, kind, summary)
		}
	}
	if code, out, _ := raydrop("status", runID); code != 0 || !strings.Contains(out, "cause") || !strings.Contains(out, kind+": ") {
		t.Errorf("status: exit %d, no cause %s:\n%s", code, kind, out)
	}
	// The report opens with it, once finalize has written the report.
	deadline := time.Now().Add(60 * time.Second)
	for r.Report == "" && time.Now().Before(deadline) {
		time.Sleep(200 * time.Millisecond)
		if r, err = probe.Runs(st).Get(context.Background(), runID); err != nil {
			t.Fatal(err)
		}
	}
	if r.Report == "" {
		t.Fatalf("run %s has no report a minute after it ended", runID)
	}
	bucket, name := report.Object(r)
	rd, err := st.GCS.Bucket(bucket).Object(name).NewReader(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rd.Close() }()
	page, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(page), `id="why"`) || !strings.Contains(string(page), ": "+kind+"</h2>") {
		t.Errorf("the report of run %s has no 'why' box naming %s", runID, kind)
	}
}

// checkDiagnose checks that raydrop diagnose names the run's cause and
// shows line, as text and as JSON, the head's Ray logs among its ranks'
// or pods' lines.
func checkDiagnose(t *testing.T, runID, kind, line string) {
	t.Helper()
	code, out, stderr := raydrop("diagnose", runID)
	t.Logf("raydrop diagnose %s:\n%s", runID, out)
	if code != 0 || !strings.Contains(out, "cause") || !strings.Contains(out, kind+": ") || !strings.Contains(out, line) ||
		!strings.Contains(out, "/evidence/attempt-") || !strings.Contains(out, "pods:") {
		t.Errorf("diagnose: exit %d, want %s and %q with the evidence folder and the pods:\n%s%s", code, kind, line, out, stderr)
	}
	code, out, stderr = raydrop("diagnose", runID, "--json")
	var d cause.Diagnosis
	if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil || d.Cause.Kind != kind || d.RunID != runID || len(d.Pods) == 0 {
		t.Errorf("diagnose --json: exit %d (%v), cause %+v, %d pods; want %s:\n%s%s", code, err, d.Cause, len(d.Pods), kind, out, stderr)
	}
}

// checkStacks checks that every rank of the hung run wrote its stacks to
// its evidence (the last rank, the scenario's hung one, outside any
// collective) and that diagnose shows where each waited, as text and as
// JSON.
func checkStacks(t *testing.T, runID string) {
	t.Helper()
	code, out, _ := raydrop("diagnose", runID, "--json")
	var d cause.Diagnosis
	if err := json.Unmarshal([]byte(out), &d); code != 0 || err != nil || len(d.Stacks) < 2 {
		t.Fatalf("diagnose --json: exit %d (%v), stacks %+v", code, err, d.Stacks)
	}
	last := len(d.Stacks) - 1
	for i, s := range d.Stacks {
		if s.Rank != i || s.InCollective == (i == last) || !strings.Contains(s.Header, "asked by the monitor: no progress since step 1") {
			t.Errorf("rank %d's stacks %+v", i, s)
		}
	}
	if !slices.Equal(d.Outside, []int{last}) {
		t.Errorf("outside %v, want [%d]", d.Outside, last)
	}
	code, out, stderr := raydrop("diagnose", runID)
	t.Logf("raydrop diagnose %s:\n%s", runID, out)
	if code != 0 || !strings.Contains(out, "where each rank waited") || !strings.Contains(out, "rank 0: all_reduce (torch/distributed/distributed_c10d.py:") ||
		!strings.Contains(out, fmt.Sprintf("rank %d: wait (threading.py:331)", last)) || !strings.Contains(out, fmt.Sprintf("ranks [%d] waited outside any collective", last)) {
		t.Errorf("diagnose: exit %d, not where each rank waited:\n%s%s", code, out, stderr)
	}
}
