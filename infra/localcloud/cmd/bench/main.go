// Command bench measures raydrop's control plane on the local cloud and
// prints the figures as a table, each against its target, and writes them
// as JSON so runs can be compared over time:
//
//   - footprint: a function process's start to its first event served, and
//     its resident memory, against a minimal functions-framework-go function
//     built the same way and measured in the same run;
//   - cost: Kubernetes API requests, Cloud Storage operations and Pub/Sub
//     publishes of one successful run, counted by the local cloud's proxies
//     and by subscriptions on every topic;
//   - latency: object upload to RayJob created, and Ray job end to terminal
//     event, over many runs (p50, p95, p99);
//   - sweep: one Monitor sweep over 1,000 active runs: its Kubernetes
//     requests, Cloud Storage operations and time;
//   - throughput: 500 specs uploaded at once: time until every run is
//     admitted (queued or on its cluster), duplicates and losses.
//
// Usage (from infra/localcloud): go run ./cmd/bench [-runs 100] [-burst 500]
// [-sweep 1000] [-only footprint,cost,latency,sweep,throughput] [-json file]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"time"

	rayclient "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned"

	"github.com/raydrop/raydrop/infra/localcloud/probe"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
)

// output is the checkpoint bucket of the benchmark's runs.
const output = "raydrop-bench-checkpoints"

// Figure is one measured value and its target.
type Figure struct {
	Section string  `json:"section"`
	Name    string  `json:"name"`
	Value   float64 `json:"value"`
	Unit    string  `json:"unit"`
	// Target is the bound the value must not exceed, when there is one.
	Target *float64 `json:"target,omitempty"`
	Met    *bool    `json:"met,omitempty"`
	Note   string   `json:"note,omitempty"`
}

// Results is what a benchmark run writes.
type Results struct {
	When    time.Time `json:"when"`
	CPUs    int       `json:"cpus"`
	Go      string    `json:"go"`
	Figures []Figure  `json:"figures"`
}

type bench struct {
	ctx    context.Context
	st     *stack.Stack
	evs    *probe.Events
	jobs   *probe.RayJobs
	ray    rayclient.Interface
	repo   string
	spec   []byte
	res    Results
	logDir string
}

// add records a figure; target < 0 means none. A missed target says by how
// much in the note.
func (b *bench) add(section, name string, value float64, unit string, target float64, note string) {
	f := Figure{Section: section, Name: name, Value: value, Unit: unit, Note: note}
	if target >= 0 {
		met := value <= target
		f.Target, f.Met = &target, &met
		if !met {
			f.Note = fmt.Sprintf("missed by %s %s", trim(value-target), unit)
			if target > 0 {
				f.Note += fmt.Sprintf(" (%.0f %% over)", (value-target)/target*100)
			}
			if note != "" {
				f.Note += "; " + note
			}
		}
	}
	b.res.Figures = append(b.res.Figures, f)
	fmt.Fprintf(os.Stderr, "bench: %s / %s = %s %s\n", section, name, trim(value), unit)
}

func trim(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "" || s == "-" {
		return "0"
	}
	return s
}

func main() {
	runsN := flag.Int("runs", 100, "runs for the latency figures")
	lanes := flag.Int("lanes", 4, "clusters the latency runs share, one run at a time on each")
	burst := flag.Int("burst", 2000, "specs uploaded at once for each throughput burst")
	burstClusters := flag.Int("burst-clusters", 10, "clusters the first burst's specs spread over (the second puts them all on one)")
	sweepN := flag.Int("sweep", 1000, "active runs the sweep figures sweep")
	footprintN := flag.Int("footprint-trials", 5, "process starts per function for the footprint figures")
	fanoutN := flag.Int("fanout-trials", 100, "trials of the sweep the fan-out figures drop")
	fanoutClusters := flag.Int("fanout-clusters", 8, "clusters that sweep's trials run on, one each at a time")
	only := flag.String("only", "footprint,cost,latency,sweep,fanout,throughput", "sections to run, comma-separated")
	jsonOut := flag.String("json", "", "write the figures as JSON to this file")
	keep := flag.Bool("keep", false, "keep the local cloud's logs")
	repo := flag.String("repo", "../..", "the repository root")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *repo, *runsN, *lanes, *burst, *burstClusters, *sweepN, *footprintN, *fanoutN, *fanoutClusters, strings.Split(*only, ","), *jsonOut, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, repo string, runsN, lanes, burst, burstClusters, sweepN, footprintN, fanoutN, fanoutClusters int, sections []string, jsonOut string, keep bool) error {
	repo, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	logDir, err := os.MkdirTemp("", "raydrop-bench-")
	if err != nil {
		return err
	}
	logf, err := os.Create(filepath.Join(logDir, "localcloud.log"))
	if err != nil {
		return err
	}
	defer func() { _ = logf.Close() }()
	st, err := stack.Start(ctx, stack.Options{
		Repo: repo, StateDir: logDir, OutputBuckets: []string{output}, DefaultSim: "steps=2,step=200ms",
		Progress: os.Stderr, Log: slog.New(slog.NewTextHandler(logf, nil)),
	})
	if err != nil {
		return err
	}
	defer st.Stop()
	b := &bench{ctx: ctx, st: st, repo: repo, logDir: logDir, res: Results{When: time.Now().UTC(), CPUs: runtime.NumCPU(), Go: runtime.Version()}}
	if b.ray, err = rayclient.NewForConfig(st.Sim.Config); err != nil {
		return err
	}
	if b.evs, err = probe.TapEvents(ctx, st, "bench-events"); err != nil {
		return err
	}
	if b.jobs, err = probe.WatchRayJobs(ctx, b.ray); err != nil {
		return err
	}
	example, err := os.ReadFile(filepath.Join(repo, "examples/gemma3-vision.json"))
	if err != nil {
		return err
	}
	b.spec = example

	steps := []struct {
		name string
		f    func() error
	}{
		{"footprint", func() error { return b.footprint(footprintN) }},
		{"cost", b.cost},
		{"latency", func() error { return b.latency(runsN, lanes) }},
		{"sweep", func() error { return b.sweep(sweepN) }},
		{"fanout", func() error { return b.fanout(fanoutN, fanoutClusters) }},
		{"throughput", func() error {
			if err := b.throughput(burst, burstClusters, "tp"); err != nil {
				return err
			}
			return b.throughput(burst, 1, "tp1")
		}},
	}
	for _, s := range steps {
		if !slices.Contains(sections, s.name) {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: --- %s ---\n", s.name)
		t0 := time.Now()
		if err := s.f(); err != nil {
			return fmt.Errorf("%s: %w (local cloud logs in %s)", s.name, err, logDir)
		}
		fmt.Fprintf(os.Stderr, "bench: %s took %.0f s\n", s.name, time.Since(t0).Seconds())
	}
	if err := b.writeRate(); err != nil {
		return err
	}
	b.print(os.Stdout)
	if jsonOut != "" {
		data, err := json.MarshalIndent(b.res, "", "  ")
		if err != nil {
			return err
		}
		if err := os.MkdirAll(filepath.Dir(jsonOut), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(jsonOut, append(data, '\n'), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "bench: figures written to %s\n", jsonOut)
	}
	if keep {
		fmt.Fprintf(os.Stderr, "bench: local cloud logs kept in %s\n", logDir)
	} else {
		_ = os.RemoveAll(logDir)
	}
	return nil
}

// print writes the table.
func (b *bench) print(w io.Writer) {
	fmt.Fprintf(w, "\nraydrop control plane on the local cloud (%d CPUs, %s, %s)\n\n", b.res.CPUs, b.res.Go, b.res.When.Format(time.RFC3339))
	fmt.Fprintf(w, "%-11s %-52s %12s %-8s %10s %s\n", "section", "figure", "value", "unit", "target", "")
	for _, f := range b.res.Figures {
		target, verdict := "", ""
		if f.Target != nil {
			target = "≤ " + trim(*f.Target)
			verdict = "met"
			if !*f.Met {
				verdict = "MISSED"
			}
		}
		fmt.Fprintf(w, "%-11s %-52s %12s %-8s %10s %s\n", f.Section, f.Name, trim(f.Value), f.Unit, target, verdict)
		if f.Note != "" {
			fmt.Fprintf(w, "%-11s   %s\n", "", f.Note)
		}
	}
}
