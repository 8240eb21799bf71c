package report

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

const layout = "../checkpoints/testdata/trainer-layout"

// stage lays the trainer's own output (the layout the trainer tests wrote
// under real Ray Train) out as attempts of one run in a bucket folder, and
// returns the bucket opener and the record of that run.
func stage(t *testing.T, phase runs.Phase, experiments ...string) (func(string) checkpoints.Store, *runs.Record) {
	t.Helper()
	root := t.TempDir()
	s := spec.Defaults()
	s.Output.Bucket, s.Output.Prefix = "ckpt", "team"
	s.Training.LearningRate = 0.01
	rec := &runs.Record{RunID: "r1", Name: "shoes", Source: "gs://intake/jobs/shoes.json", Phase: phase, Spec: &s, Cluster: "c", Namespace: "ns", SpecHash: "abc"}
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	rec.History = []runs.Entry{{Phase: runs.Accepted, At: t0}, {Phase: runs.Provisioned, At: t0.Add(time.Minute), Attempt: 1}, {Phase: runs.Running, At: t0.Add(3 * time.Minute), Attempt: 1}}
	res := &checkpoints.Result{}
	for i, exp := range experiments {
		n := i + 1
		b, prefix := manifests.Experiment(rec.Spec, rec.RunID, n)
		dst := filepath.Join(root, b, filepath.FromSlash(prefix))
		if err := os.CopyFS(dst, os.DirFS(filepath.Join(layout, exp))); err != nil {
			t.Fatal(err)
		}
		r, err := checkpoints.Discover(context.Background(), checkpoints.Dir(filepath.Join(root, b)), prefix)
		if err != nil {
			t.Fatal(err)
		}
		res.Checkpoints = append(res.Checkpoints, r.Checkpoints...)
		if r.Best != nil && (res.Best == nil || checkpoints.Better(r.Best, res.Best)) {
			res.Best, res.BestBy = r.Best, r.BestBy
		}
		res.Latest, res.Mark, res.FinalMetrics = r.Latest, r.Mark, r.FinalMetrics
		rec.Attempt = n
		ran := t0.Add(time.Minute)
		a := runs.Attempt{N: n, RayJob: "r1-" + string(rune('0'+n)), CreatedAt: ran, RunningAt: &ran}
		if n == 2 {
			a.Startup = &runs.Startup{ScheduledAt: ran.Add(40 * time.Second), StartedAt: ran.Add(55 * time.Second)}
		}
		rec.Attempts = append(rec.Attempts, a)
	}
	end := t0.Add(10 * time.Minute)
	rec.History = append(rec.History, runs.Entry{Phase: phase, At: end})
	rec.Times = map[runs.Phase]time.Time{runs.Accepted: t0, phase: end}
	rec.CreatedAt = t0
	rec.Result = res
	return func(b string) checkpoints.Store { return checkpoints.Dir(filepath.Join(root, b)) }, rec
}

func build(t *testing.T, bucket func(string) checkpoints.Store, rec *runs.Record) string {
	t.Helper()
	page, err := Build(context.Background(), bucket, rec, config.Config{GPUHourUSD: 12}, time.Date(2026, 12, 1, 11, 0, 0, 0, time.UTC))
	if err != nil {
		t.Fatal(err)
	}
	return string(page)
}

func count(t *testing.T, page, pattern string) int {
	t.Helper()
	return len(regexp.MustCompile(pattern).FindAllStringIndex(page, -1))
}

func TestReportOfASucceededRun(t *testing.T) {
	bucket, rec := stage(t, runs.Succeeded, "exp-a", "exp-b")
	page := build(t, bucket, rec)

	// Every chart has a dot for each logged report with its metric, over
	// both attempts; the closing summary is not a step.
	want := map[string]int{}
	for n := 1; n <= 2; n++ {
		b, exp := manifests.Experiment(rec.Spec, rec.RunID, n)
		lines, err := checkpoints.Series(context.Background(), bucket(b), exp)
		if err != nil {
			t.Fatal(err)
		}
		for _, l := range lines {
			for _, m := range Metrics() {
				if _, ok := l[m]; ok {
					want[m]++
				}
			}
		}
	}
	if want["loss"] != 12+8 || want["eval_loss"] != 2+2 {
		t.Fatalf("the layout's reports changed: %v", want)
	}
	for _, m := range Metrics() {
		if got := count(t, page, `<circle class="pt `+m+`"`); got != want[m] {
			t.Errorf("%s: %d points, want %d", m, got, want[m])
		}
	}
	if got := count(t, page, `<g class="series attempt-2" data-metric="loss"`); got != 1 {
		t.Errorf("attempt 2's loss series appears %d times", got)
	}

	// The best checkpoint (by held-out loss) is marked, once.
	if got := count(t, page, `data-best="true"`); got != 1 {
		t.Errorf("%d rows marked best", got)
	}
	best := rec.Result.Best
	if !strings.Contains(page, `class="best" data-best="true"><td><span class="star" title="best">★ best</span></td><td>`+best.Name) {
		t.Errorf("the best row is not %s", best.Name)
	}
	if !strings.Contains(page, "lowest held-out loss (eval_loss)") {
		t.Error("the report does not say what the best was chosen by")
	}

	// The sample answers are there, their image inlined.
	if got := count(t, page, `<img src="data:image/png;base64,`); got != 1 {
		t.Errorf("%d inlined images, want 1", got)
	}
	for _, s := range []string{"Tool 6", "A green tool for work."} {
		if !strings.Contains(page, s) {
			t.Errorf("sample text %q missing", s)
		}
	}

	// The spec's differences from the defaults, and the cost.
	// 2 attempts of 9 minutes on 16 GPUs, at $12 per GPU-hour.
	// Each attempt's capacity tier.
	if n := strings.Count(page, `<td class="tier">reservation, tier 1 of 1</td>`); n != 2 {
		t.Errorf("%d attempts name their reservation tier, want 2", n)
	}
	// Each attempt's start-up, where the monitor saw its workers come up.
	for _, s := range []string{`<td class="startup">–</td>`, `<td class="startup">55s: nodes 40s, image 15s</td>`} {
		if n := strings.Count(page, s); n != 1 {
			t.Errorf("%q appears %d times, want once", s, n)
		}
	}
	for _, s := range []string{`<code>output.bucket</code>`, `<code>training.learningRate</code>`, `id="cost">$57.60 at $12 per GPU-hour`} {
		if !strings.Contains(page, s) {
			t.Errorf("%q missing", s)
		}
	}
	if strings.Contains(page, `<code>model.id</code>`) || strings.Contains(page, `<code>$schema</code>`) {
		t.Error("a field that is not a changed setting is listed as changed")
	}
	if !strings.Contains(page, `<tr><td><code>output.bucket</code></td><td><code>(no default)</code></td><td><code>&#34;ckpt&#34;</code></td></tr>`) {
		t.Error("a required field is not shown as having no default")
	}
	for _, log := range []string{"gs://ckpt/team/r1/attempt-1/driver.log", "gs://ckpt/team/r1/attempt-2/driver.log"} {
		if !strings.Contains(page, log) {
			t.Errorf("the report does not name the driver log %s", log)
		}
	}
	selfContained(t, page)
}

func TestReportOfAFailedRun(t *testing.T) {
	bucket, rec := stage(t, runs.Failed, "exp-fail")
	rec.Reason, rec.Message = "JobFailed", "the trainer raised ValueError: too many long rows"
	rec.Cause = &runs.Cause{Kind: "CudaOutOfMemory", Summary: "CUDA out of memory after step 12 on rank 3 (pod c-gpu-group-worker-abcde)",
		Hint: "lower training.perDeviceBatchSize", Rank: 3, Pod: "c-gpu-group-worker-abcde", Step: 12,
		Lines: []string{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.50 GiB."}, Source: "ray/c-gpu-group-worker-abcde/worker-0a1b-02000000-4251.err"}
	// The evidence finalize kept: its files and what it could not keep.
	rec.Evidence = "gs://ckpt/team/r1/evidence/"
	m := evidence.Manifest{SchemaVersion: 1, RunID: "r1", Attempt: 1, LogCapBytes: 2 << 20, Files: []evidence.File{
		{Path: "pods.json", Kind: evidence.KindPods, Bytes: 2048},
		{Path: "logs/c-gpu-group-worker-abcde/ray-worker.previous.log.gz", Kind: evidence.KindLog, Pod: "c-gpu-group-worker-abcde", Container: "ray-worker", Previous: true, Bytes: 1024, LogBytes: 3 << 20, Capped: true},
	}, Missing: []evidence.Missing{{What: "events.json", Why: "the capture's budget was spent"}}}
	doc, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(string(bucket("ckpt").(checkpoints.Dir)), "team", "r1", "evidence", "attempt-1")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, evidence.ManifestFile), doc, 0o644); err != nil {
		t.Fatal(err)
	}
	// What a worker's raylogs sidecar copied beside it.
	ray := filepath.Join(dir, "ray", "c-gpu-group-worker-abcde")
	if err := os.MkdirAll(ray, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"index.json", "raylet.out", "worker-0a1b-02000000-4251.err"} {
		if err := os.WriteFile(filepath.Join(ray, f), []byte("x"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	page := build(t, bucket, rec)
	for _, s := range []string{`id="reason"`, "too many long rows", `class="phase failed"`, "the run did not finish training",
		`id="evidence"`, "1 thing(s) could not be kept", "attempt-1/logs/c-gpu-group-worker-abcde/ray-worker.previous.log.gz",
		"ray-worker (before its restart)", "the last 2048.0 KiB of 3072.0 KiB", "not kept: the capture&#39;s budget was spent",
		`id="why"`, "Why it failed: CudaOutOfMemory", "CUDA out of memory after step 12 on rank 3", "What to change: lower training.perDeviceBatchSize",
		"Tried to allocate 4.50 GiB.", "attempt-1/ray/c-gpu-group-worker-abcde/worker-0a1b-02000000-4251.err</span>",
		`id="ray-logs"`, "evidence/attempt-1/ray/c-gpu-group-worker-abcde/", "<code>worker-0a1b-02000000-4251.err</code>"} {
		if !strings.Contains(page, s) {
			t.Errorf("%q missing", s)
		}
	}
	selfContained(t, page)
}

func TestReportOfARunCancelledWhileQueued(t *testing.T) {
	bucket, rec := stage(t, runs.Cancelled)
	rec.Reason, rec.Message = "Cancelled", "cancelled while queued"
	page := build(t, bucket, rec)
	for _, s := range []string{"No attempt logged a step before the run ended", "The run saved no checkpoint", `id="timeline"`} {
		if !strings.Contains(page, s) {
			t.Errorf("%q missing", s)
		}
	}
	if strings.Contains(page, "<figure") {
		t.Error("a chart without data")
	}
}

func TestReportURI(t *testing.T) {
	_, rec := stage(t, runs.Succeeded)
	if got := URI(rec); got != "gs://ckpt/team/r1/report.html" {
		t.Errorf("URI = %q", got)
	}
	rec.Spec = nil
	if got := URI(rec); got != "" {
		t.Errorf("a run without a spec has report %q", got)
	}
}

// selfContained fails if the page would fetch anything: a script, a style
// sheet, a font, or an image not inlined.
func selfContained(t *testing.T, page string) {
	t.Helper()
	for _, re := range []string{`<script`, `<link`, `@import`, `url\(`, `src="(?:https?:|//|gs:)`, `href="(?:https?:|//)`} {
		if regexp.MustCompile(re).MatchString(page) {
			t.Errorf("the page is not self-contained: it has %s", re)
		}
	}
}
