package e2e_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/report"
	"github.com/raydrop/raydrop/pkg/runs"
)

// reportDir is where the browser test leaves the report it rendered and
// its screenshot, for people to look at.
const reportDir = "../../../.build/report"

// fetchReport checks that the run's report_ready event names its report,
// as its record now does, and copies the report from the bucket to file.
func fetchReport(t *testing.T, r *runs.Record, uri, file string) {
	t.Helper()
	r, err := probe.Runs(st).Get(context.Background(), r.RunID)
	if err != nil {
		t.Fatal(err)
	}
	if uri == "" || uri != report.URI(r) || r.Report != uri {
		t.Fatalf("report %q in the event, %q in the record; want %s", uri, r.Report, report.URI(r))
	}
	bucket, name := report.Object(r)
	rd, err := st.GCS.Bucket(bucket).Object(name).NewReader(context.Background())
	if err != nil {
		t.Fatalf("report %s: %v", uri, err)
	}
	defer func() { _ = rd.Close() }()
	if ct := rd.Attrs.ContentType; ct != report.ContentType {
		t.Errorf("report content type %q, want %q", ct, report.ContentType)
	}
	b, err := io.ReadAll(rd)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestReportInABrowser renders the report of a run that lost its head
// node once (two attempts) and then succeeded in a real headless Chromium:
// every chart has a point per logged step of either attempt, the best
// checkpoint is marked, every sample image loads, and the page fetches
// nothing. It leaves the page and a screenshot in .build/report/.
func TestReportInABrowser(t *testing.T) {
	t.Parallel()
	chromium := os.Getenv("RAYDROP_CHROMIUM")
	if chromium == "" {
		t.Skip("RAYDROP_CHROMIUM is not set: `make localcloud-test` installs Debian's Chromium and sets it")
	}
	if _, err := os.Stat(chromium); err != nil {
		t.Fatalf("RAYDROP_CHROMIUM: %v", err)
	}
	runID := upload(t, "report", specFor(t, "e2e-report", nil), "outcome=lose-head,at=6,steps=4,step=200ms")
	r := waitPhase(t, runID, 150*time.Second, runs.Succeeded, runs.Failed, runs.Cancelled)
	if r.Phase != runs.Succeeded || r.Attempt != 2 {
		t.Fatalf("phase %s attempt %d (%s); want SUCCEEDED on attempt 2", r.Phase, r.Attempt, r.Message)
	}
	evs := eventsOf(t, runID)
	final := terminalOf(t, evs)
	page, err := filepath.Abs(filepath.Join(reportDir, "report.html"))
	if err != nil {
		t.Fatal(err)
	}
	fetchReport(t, r, reportURI(t, evs), page)

	// What the page must show: a point per logged report with the metric,
	// over every attempt, read from Ray Train's result.json in the bucket.
	want := map[string]int{}
	gcs := &gcp.GCS{Client: st.GCS}
	for n := 1; n <= r.Attempt; n++ {
		b, exp := manifests.Experiment(r.Spec, r.RunID, n)
		lines, err := checkpoints.Series(context.Background(), gcs.Bucket(b), exp)
		if err != nil {
			t.Fatal(err)
		}
		if len(lines) == 0 {
			t.Fatalf("attempt %d logged no step", n)
		}
		for _, l := range lines {
			for _, m := range report.Metrics() {
				if _, ok := l[m]; ok {
					want[m]++
				}
			}
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	actx, acancel := chromedp.NewExecAllocator(ctx, append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium), chromedp.NoSandbox, chromedp.DisableGPU,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true), chromedp.WindowSize(1200, 900))...)
	defer acancel()
	bctx, bcancel := chromedp.NewContext(actx)
	defer bcancel()
	var mu sync.Mutex
	var fetched []string
	if err := chromedp.Listen(bctx, func(ev any) {
		if e, ok := ev.(*network.EventRequestWillBeSent); ok {
			mu.Lock()
			fetched = append(fetched, e.Request.URL)
			mu.Unlock()
		}
	}); err != nil {
		t.Fatalf("start Chromium: %v", err)
	}
	type shown struct {
		Points  map[string]int `json:"points"`
		Best    []string       `json:"best"`
		Images  int            `json:"images"`
		Loaded  int            `json:"loaded"`
		Phase   string         `json:"phase"`
		Samples int            `json:"samples"`
		Scores  []string       `json:"scores"`
	}
	if err := chromedp.Do(bctx, chromedp.Navigate("file://"+page), chromedp.WaitReady("footer")); err != nil {
		t.Fatalf("open %s in Chromium: %v", page, err)
	}
	seen, err := chromedp.Run(bctx, chromedp.Evaluate[shown](`(() => {
		const points = {};
		for (const c of document.querySelectorAll("circle.pt")) points[c.dataset.metric] = (points[c.dataset.metric] || 0) + 1;
		const imgs = [...document.querySelectorAll("#samples img")];
		return {
			points,
			best: [...document.querySelectorAll("#checkpoints tr[data-best]")].map(tr => tr.cells[1].textContent + " " + tr.cells[7].textContent),
			images: imgs.length,
			loaded: imgs.filter(i => i.complete && i.naturalWidth > 0).length,
			phase: document.getElementById("phase").textContent,
			samples: document.querySelectorAll("#samples .sample").length,
			scores: [...document.querySelectorAll("#sample-scores tr")].map(tr => [...tr.cells].map(c => c.textContent).join(" ")),
		};
	})()`))
	if err != nil {
		t.Fatalf("read the rendered page: %v", err)
	}
	shot, err := chromedp.Run(bctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	shotFile := filepath.Join(reportDir, "report.png")
	if err := os.WriteFile(shotFile, shot, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("report %s rendered; screenshot %s (%d bytes)", page, shotFile, len(shot))

	for _, m := range report.Metrics() {
		if seen.Points[m] != want[m] || want[m] == 0 {
			t.Errorf("%s: %d points drawn, the run logged %d", m, seen.Points[m], want[m])
		}
	}
	if b := final.BestCheckpoint; len(seen.Best) != 1 || !strings.Contains(seen.Best[0], b.Name+" "+b.URI) {
		t.Errorf("rows marked best %q, want only %s %s", seen.Best, b.Name, b.URI)
	}
	if n := final.Samples.Count; seen.Samples != n || seen.Images != n || seen.Loaded != n {
		t.Errorf("%d samples, %d images, %d loaded; want %d of each", seen.Samples, seen.Images, seen.Loaded, n)
	}
	// The simulated trainer's answers, scored as trainer/samples.py scores them.
	if want := []string{"Model Exact match Word-overlap F1", "Base 0 0.5455", "Tuned 1 1"}; !slices.Equal(seen.Scores, want) {
		t.Errorf("sample scores shown %q, want %q", seen.Scores, want)
	}
	if seen.Phase != string(runs.Succeeded) {
		t.Errorf("phase shown %q", seen.Phase)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, u := range fetched {
		if !strings.HasPrefix(u, "file://") && !strings.HasPrefix(u, "data:") {
			t.Errorf("the page fetched %s: it must be self-contained", u)
		}
	}
	if len(fetched) == 0 {
		t.Error("no request seen: the network listener saw nothing")
	}
	t.Logf("points drawn: %v", seen.Points)
}
