package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"

	"github.com/raydrop/raydrop/infra/localcloud/faults"
	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/wiring"
)

// footprint starts raydrop's function binary (serving Provision) and the
// minimal function alternately, trials times each, and measures process
// start to the first event answered 2xx and the resident memory then. The
// raydrop function's first event builds its clients, as in the cloud.
func (b *bench) footprint(trials int) error {
	dir, err := os.MkdirTemp("", "raydrop-footprint-")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	raydrop, minimal := filepath.Join(dir, "functions"), filepath.Join(dir, "minimal")
	for _, c := range []struct{ out, pkg, dir string }{
		{raydrop, "./cmd/functions", b.repo},
		{minimal, "./cmd/minimalfn", filepath.Join(b.repo, "infra/localcloud")},
	} {
		// Both built as the deployment builds its functions.
		cmd := exec.CommandContext(b.ctx, "go", "build", "-o", c.out, c.pkg)
		cmd.Dir = c.dir
		cmd.Env = append(os.Environ(), stack.BuildEnv...)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("build %s: %w\n%s", c.pkg, err, out)
		}
	}
	b.st.PauseTicks(true)
	defer b.st.PauseTicks(false)
	// An object outside jobs/: Provision reads its configuration, builds
	// its clients and acknowledges it.
	event := func(req *http.Request) {
		req.Header.Set("ce-specversion", "1.0")
		req.Header.Set("ce-id", "footprint")
		req.Header.Set("ce-type", "google.cloud.storage.object.v1.finalized")
		req.Header.Set("ce-source", "//storage.googleapis.com/projects/_/buckets/"+stack.IntakeBucket)
		req.Header.Set("ce-subject", "objects/bench/footprint.json")
		req.Header.Set("Content-Type", "application/json")
	}
	body := fmt.Sprintf(`{"bucket": %q, "name": "bench/footprint.json", "generation": "1", "size": "2"}`, stack.IntakeBucket)
	var rStart, mStart, rRSS, mRSS, rAnon, mAnon []float64
	for range trials {
		d, mem, err := startOnce(b.ctx, raydrop, "Provision", append(b.st.Env(), config.Config{ScaleDownAge: 30 * time.Second, OutputBuckets: []string{output}, Namespaces: []string{stack.Namespace}}.Env()...), event, body)
		if err != nil {
			return fmt.Errorf("raydrop function: %w", err)
		}
		rStart, rRSS, rAnon = append(rStart, d), append(rRSS, mem.rss), append(rAnon, mem.anon)
		if d, mem, err = startOnce(b.ctx, minimal, "Minimal", nil, event, body); err != nil {
			return fmt.Errorf("minimal function: %w", err)
		}
		mStart, mRSS, mAnon = append(mStart, d), append(mRSS, mem.rss), append(mAnon, mem.anon)
	}
	rs, ms, rm, mm := median(rStart), median(mStart), median(rRSS), median(mRSS)
	note := fmt.Sprintf("median of %d starts each", trials)
	b.add("footprint", "raydrop function: start to first event served", rs, "ms", -1, note)
	b.add("footprint", "minimal function: start to first event served", ms, "ms", -1, note)
	b.add("footprint", "start-up ratio raydrop/minimal", rs/ms, "x", 1.5, "")
	b.add("footprint", "raydrop function: resident memory after first event", rm/1024, "MiB", -1, note)
	b.add("footprint", "minimal function: resident memory after first event", mm/1024, "MiB", -1, note)
	b.add("footprint", "memory ratio raydrop/minimal", rm/mm, "x", 2, "")
	b.add("footprint", "raydrop function: anonymous memory (heap, stacks)", median(rAnon)/1024, "MiB", -1, note)
	b.add("footprint", "minimal function: anonymous memory (heap, stacks)", median(mAnon)/1024, "MiB", -1, note)
	for _, bin := range []string{raydrop, minimal} {
		if fi, err := os.Stat(bin); err == nil {
			b.add("footprint", filepath.Base(bin)+" binary size", float64(fi.Size())/(1<<20), "MiB", -1, "")
		}
	}
	return nil
}

// startOnce starts a function binary and returns the milliseconds from the
// process start to its first 2xx answer and its resident memory (KiB) then.
func startOnce(ctx context.Context, bin, target string, env []string, event func(*http.Request), body string) (float64, memKiB, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, memKiB{}, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	var out bytes.Buffer
	cmd := exec.Command(bin)
	cmd.Env = append(append(os.Environ(), env...), "FUNCTION_TARGET="+target, "PORT="+strconv.Itoa(port), "LOCAL_ONLY=true")
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/"
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, memKiB{}, err
	}
	defer func() {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
	}()
	for time.Since(t0) < 30*time.Second && ctx.Err() == nil {
		req, _ := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
		event(req)
		resp, err := client.Do(req)
		if err != nil {
			time.Sleep(2 * time.Millisecond)
			continue
		}
		_ = resp.Body.Close()
		if resp.StatusCode/100 != 2 {
			return 0, memKiB{}, fmt.Errorf("%s answered %d:\n%s", target, resp.StatusCode, out.String())
		}
		took := float64(time.Since(t0).Microseconds()) / 1000
		mem, err := residentKiB(cmd.Process.Pid)
		return took, mem, err
	}
	return 0, memKiB{}, fmt.Errorf("%s served nothing within 30 s:\n%s", target, out.String())
}

// memKiB is a process's resident memory from /proc: all of it (VmRSS) and
// the anonymous part (RssAnon: heap, stacks), the rest being the pages of
// the binary itself.
type memKiB struct{ rss, anon float64 }

func residentKiB(pid int) (memKiB, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return memKiB{}, err
	}
	var m memKiB
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		for key, dst := range map[string]*float64{"VmRSS:": &m.rss, "RssAnon:": &m.anon} {
			if v, ok := strings.CutPrefix(line, key); ok {
				if *dst, err = strconv.ParseFloat(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 64); err != nil {
					return m, err
				}
				found++
			}
		}
	}
	if found != 2 {
		return m, errors.New("no VmRSS or RssAnon in /proc status")
	}
	return m, nil
}

// counter counts the messages published to the pipeline's topics through
// a pull subscription on each.
type counter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (b *bench) countTopics(ctx context.Context, tag string) (*counter, error) {
	c := &counter{counts: map[string]int{}}
	var topics []string
	for _, k := range wiring.TopicKeys {
		topics = append(topics, stack.Topics.Name(k))
	}
	for _, topic := range topics {
		sub := "bench-" + tag + "-" + topic
		if err := b.st.PubSub.Tap(ctx, topic, sub, func(context.Context, *pubsubpb.PubsubMessage) bool {
			c.mu.Lock()
			c.counts[topic]++
			c.mu.Unlock()
			return true
		}); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *counter) get(topic string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[topic]
}

// cost counts what one successful run asks of the services: first on a new
// cluster, then on the same cluster again. The scheduler is paused, so only
// the run's own events count.
func (b *bench) cost() error {
	ctx, cancel := context.WithCancel(b.ctx)
	defer cancel()
	b.st.PauseTicks(true)
	defer b.st.PauseTicks(false)
	time.Sleep(time.Second) // a tick in flight ends
	for i, label := range []string{"new cluster", "existing cluster"} {
		c, err := b.countTopics(ctx, fmt.Sprintf("cost%d", i))
		if err != nil {
			return err
		}
		b.st.KubeProxy.Reset()
		b.st.GCSProxy.Reset()
		before := b.st.Adapter.Stats()
		data, err := probe.Spec(b.spec, "bench-cost", output, nil)
		if err != nil {
			return err
		}
		runID, err := probe.Upload(ctx, b.st, fmt.Sprintf("cost-%d", i), data, "steps=2,step=200ms")
		if err != nil {
			return err
		}
		if _, err := b.evs.WaitTerminal(runID, 120*time.Second, 3*time.Second); err != nil {
			return err
		}
		kube, gcs := b.st.KubeProxy.Requests(), b.st.GCSProxy.Requests()
		publishes := 0
		for _, t := range []string{stack.Topics.Provisioned, stack.Topics.Submitted, stack.Topics.Finished, stack.Topics.Events} {
			publishes += c.get(t)
		}
		after := b.st.Adapter.Stats()
		invocations, byRoute := 0, []string{}
		for route, st := range after {
			if d := st.Deliveries - before[route].Deliveries; d > 0 {
				invocations += d
				byRoute = append(byRoute, fmt.Sprintf("%s %d", route, d))
			}
		}
		slices.Sort(byRoute)
		section := "cost"
		// Every invocation is a billed Cloud Run request: at most 8 per run
		// (provision, submit, monitor on submitted and on the mark notice,
		// finalize, and what a retry or hand-over adds).
		b.add(section, "function invocations per run, "+label, float64(invocations), "events", 8, strings.Join(byRoute, ", "))
		b.add(section, "Kubernetes API requests per run, "+label, float64(len(kube)), "requests", -1, byFunction(kube))
		reads, writes := splitWrites(gcs)
		b.add(section, "Cloud Storage reads per run, "+label, float64(len(reads)), "ops", -1, byFunction(reads))
		b.add(section, "Cloud Storage writes per run, "+label, float64(len(writes)), "ops", -1, byFunction(writes))
		b.add(section, "Pub/Sub publishes per run, "+label, float64(publishes), "messages", -1,
			fmt.Sprintf("provisioned %d, submitted %d, finished %d, events %d", c.get(stack.Topics.Provisioned), c.get(stack.Topics.Submitted), c.get(stack.Topics.Finished), c.get(stack.Topics.Events)))
	}
	return nil
}

// splitWrites splits requests into reads and writes.
func splitWrites(reqs []faults.Request) (reads, writes []faults.Request) {
	for _, r := range reqs {
		if r.Write {
			writes = append(writes, r)
		} else {
			reads = append(reads, r)
		}
	}
	return reads, writes
}

// byFunction summarises requests by function and verb.
func byFunction(reqs []faults.Request) string {
	counts := map[string]int{}
	for _, r := range reqs {
		verb := "read"
		if r.Write {
			verb = "write"
		}
		counts[r.Client+" "+verb]++
	}
	var parts []string
	for k, n := range counts {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// latency runs n runs, lanes at a time, each lane one run after another on
// its own cluster, and measures upload → RayJob created, Ray job end →
// terminal event, and Ray job end → report ready (the report is rendered
// after the terminal event, and announced by an event of its own).
func (b *bench) latency(n, lanes int) error {
	var mu sync.Mutex
	var toJob, toEvent, toReport, capture []float64
	var errs []error
	var wg sync.WaitGroup
	for lane := range lanes {
		wg.Go(func() {
			for i := lane; i < n; i += lanes {
				l, err := b.oneRun(fmt.Sprintf("lat-%d", i), fmt.Sprintf("bench-lat-%d", lane))
				mu.Lock()
				if err != nil {
					errs = append(errs, err)
				} else {
					toJob, toEvent, toReport = append(toJob, l.toJob), append(toEvent, l.toEvent), append(toReport, l.toReport)
					capture = append(capture, l.capture)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	note := fmt.Sprintf("%d runs, %d clusters, one run at a time on each", n, lanes)
	b.add("latency", "upload → RayJob created, p50", percentile(toJob, 50), "s", 1, note)
	b.add("latency", "upload → RayJob created, p95", percentile(toJob, 95), "s", -1, note)
	b.add("latency", "upload → RayJob created, p99", percentile(toJob, 99), "s", 3, note)
	b.add("latency", "Ray job end → terminal event, p50", percentile(toEvent, 50), "s", -1, note)
	b.add("latency", "Ray job end → terminal event, p95", percentile(toEvent, 95), "s", -1, note)
	b.add("latency", "Ray job end → terminal event, p99", percentile(toEvent, 99), "s", 1, note)
	b.add("latency", "Ray job end → report ready, p50", percentile(toReport, 50), "s", -1, note)
	b.add("latency", "Ray job end → report ready, p95", percentile(toReport, 95), "s", -1, note)
	b.add("latency", "Ray job end → report ready, p99", percentile(toReport, 99), "s", -1, note)
	// The evidence's capture, within the job end → terminal event figures:
	// finalize keeps it before the workers are scaled down, within its
	// budget (60 s by default).
	b.add("latency", "evidence capture (pods' logs, statuses, events), p50", percentile(capture, 50), "s", -1, note)
	b.add("latency", "evidence capture (pods' logs, statuses, events), p99", percentile(capture, 99), "s", evidence.DefaultBudget.Seconds(), note)
	return nil
}

// runLatency is one run's latencies, in seconds.
type runLatency struct {
	toJob    float64 // the upload → the RayJob's creation
	toEvent  float64 // the Ray job's end → the terminal event's arrival
	toReport float64 // the Ray job's end → the report_ready event's arrival
	capture  float64 // the evidence's capture, from its manifest
}

// oneRun uploads one spec and measures its latencies.
func (b *bench) oneRun(name, cluster string) (runLatency, error) {
	var l runLatency
	data, err := probe.Spec(b.spec, cluster, output, nil)
	if err != nil {
		return l, err
	}
	runID, err := probe.Upload(b.ctx, b.st, name, data, "steps=2,step=200ms")
	uploaded := time.Now()
	if err != nil {
		return l, err
	}
	evs, err := b.evs.WaitTerminal(runID, 180*time.Second, 0)
	if err != nil {
		return l, err
	}
	term := probe.Terminal(evs)
	if term.Phase != "succeeded" {
		return l, fmt.Errorf("run %s ended %s: %s", runID, term.Phase, term.Message)
	}
	if evs, err = b.evs.WaitReport(runID, 60*time.Second, 0); err != nil {
		return l, err
	}
	rep := probe.Report(evs)
	created := b.jobs.Of(runID)
	if len(created) != 1 {
		return l, fmt.Errorf("run %s: %d RayJobs", runID, len(created))
	}
	var ended time.Time
	for _, r := range b.st.Sim.Played() {
		if r.RayJob == "default/"+names.RayJob(runID, 1) {
			ended = r.Ended
		}
	}
	if ended.IsZero() {
		return l, fmt.Errorf("run %s: the simulator has no end time for its Ray job", runID)
	}
	m, err := b.evidence(term.Evidence, 1)
	if err != nil {
		return l, fmt.Errorf("run %s: %w", runID, err)
	}
	return runLatency{toJob: created[0].At.Sub(uploaded).Seconds(), toEvent: term.At.Sub(ended).Seconds(), toReport: rep.At.Sub(ended).Seconds(),
		capture: m.FinishedAt.Sub(m.StartedAt).Seconds()}, nil
}

// evidence reads the manifest of an attempt's evidence under a run's
// evidence folder (gs://…/evidence/), and fails unless it is complete.
func (b *bench) evidence(folder string, attempt int) (*evidence.Manifest, error) {
	bucket, prefix, err := evidence.Locate(folder, attempt)
	if err != nil {
		return nil, fmt.Errorf("the terminal event's evidence: %w", err)
	}
	name := prefix + "/" + evidence.ManifestFile
	rd, err := b.st.GCS.Bucket(bucket).Object(name).NewReader(b.ctx)
	if err != nil {
		return nil, fmt.Errorf("evidence manifest gs://%s/%s: %w", bucket, name, err)
	}
	defer func() { _ = rd.Close() }()
	var m evidence.Manifest
	if err := json.NewDecoder(rd).Decode(&m); err != nil {
		return nil, fmt.Errorf("evidence manifest gs://%s/%s: %w", bucket, name, err)
	}
	if !m.Complete {
		return nil, fmt.Errorf("evidence of attempt %d incomplete: %+v", attempt, m.Missing)
	}
	return &m, nil
}

// throughput uploads n specs at once over clusters clusters (named
// bench-<tag>-<i>) and measures the time until every run is admitted
// (QUEUED, or holding its cluster), then counts duplicates (a second
// accepted event or RayJob) and losses (runs not admitted within 5
// minutes). The runs' simulated jobs last long, so that no cluster changes
// hands while the burst is measured, nor during the next burst.
func (b *bench) throughput(n, clusters int, tag string) error {
	ctx := b.ctx
	ids := make([]string, n)
	// What Eventarc delivered to Provision meanwhile: how many at once, and
	// how long Provision took with each.
	watch := probe.WatchDeliveries(b.st, "provision-intake")
	defer watch.Stop()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var uploadErr error
	var mu sync.Mutex
	t0 := time.Now()
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			data, err := probe.Spec(b.spec, fmt.Sprintf("bench-%s-%d", tag, i%clusters), output, nil)
			if err == nil {
				ids[i], err = probe.Upload(ctx, b.st, fmt.Sprintf("burst-%s-%04d", tag, i), data, "steps=1,step=10m")
			}
			if err != nil {
				mu.Lock()
				uploadErr = err
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if uploadErr != nil {
		return uploadErr
	}
	uploaded := time.Since(t0)
	store := probe.Runs(b.st)
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	var admittedAt time.Duration
	admitted := 0
	for time.Since(t0) < 5*time.Minute {
		sums, err := store.List(ctx)
		if err != nil {
			return err
		}
		admitted = 0
		for _, s := range sums {
			if want[s.RunID] && s.Phase != runs.Accepted && s.Phase != runs.Rejected {
				admitted++
			}
		}
		if admitted == n {
			admittedAt = time.Since(t0)
			break
		}
		time.Sleep(time.Second) // each look lists every record: not too often
	}
	dups := 0
	for _, id := range ids {
		if k := probe.Count(b.evs.Of(id), "accepted"); k > 1 {
			dups += k - 1
		}
		if k := len(b.jobs.Of(id)); k > 1 {
			dups += k - 1
		}
	}
	delivered, inFlight, meanTook := watch.Stop()
	note := fmt.Sprintf("%d specs, uploaded in %.1f s by 32 uploaders; by the last admission, Eventarc had delivered %d intake events to Provision, at most %d at once, %.0f ms each on average",
		n, uploaded.Seconds(), delivered, inFlight, meanTook)
	over := fmt.Sprintf("%d clusters", clusters)
	if clusters == 1 {
		over = "one cluster"
	}
	if admittedAt == 0 {
		b.add("throughput", "time until every run is admitted, "+over, time.Since(t0).Seconds(), "s", 60, fmt.Sprintf("%s; only %d admitted", note, admitted))
	} else {
		b.add("throughput", "time until every run is admitted, "+over, admittedAt.Seconds(), "s", 60, note)
	}
	b.add("throughput", "duplicates (second accepted event or RayJob), "+over, float64(dups), "", 0, "")
	b.add("throughput", "losses (runs not admitted in 5 min), "+over, float64(n-admitted), "", 0, "")
	return nil
}

// writeRate reports the writes the local cloud's Cloud Storage door
// refused over the whole benchmark for coming less than a second after the
// last write of the same object (Cloud Storage's limit), by object kind.
func (b *bench) writeRate() error {
	refused := b.st.GCSProxy.LimitRefusals()
	kinds := map[string]int{}
	for _, r := range refused {
		kinds[objectKind(r.Path)]++
	}
	var parts []string
	for k, n := range kinds {
		parts = append(parts, fmt.Sprintf("%s %d", k, n))
	}
	slices.Sort(parts)
	b.add("storage", "writes refused: one object written twice within 1 s", float64(len(refused)), "writes", 0, strings.Join(parts, ", "))
	return nil
}

// objectKind names the kind of state object a Cloud Storage request writes.
func objectKind(path string) string {
	p, _ := url.QueryUnescape(path)
	switch {
	case strings.Contains(p, "/waiting/"):
		return "waiting runs"
	case strings.Contains(p, "clusters/"):
		return "cluster leases"
	case strings.Contains(p, "runs/"):
		return "run records"
	}
	return "other"
}

func median(v []float64) float64 { return percentile(v, 50) }

// percentile is the nearest-rank percentile.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	rank := int(p/100*float64(len(s))+0.999999) - 1
	return s[min(max(rank, 0), len(s)-1)]
}
