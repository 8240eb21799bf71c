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
//   - fanout: one sweep of many trials, admitted, fanned out and cancelled;
//   - throughput: 2,000 specs uploaded at once: time until every run is
//     admitted (queued or on its cluster), duplicates and losses;
//   - datacheck: the trainer's data check (trainer/bench/datacheck_bench.py)
//     in rows per second per core.
//
// Each figure is printed beside the one docs/benchmarks.json holds (the
// figures docs/benchmarks.md quotes), so a regression shows in one run; the
// two compare only when measured on the same kind of machine. Every section
// must produce its figures, or the command fails: -smoke runs each section
// small (make bench-smoke, part of make test), so a section that breaks
// fails the tests, not only a later make bench.
//
// Usage (from infra/localcloud): go run ./cmd/bench [-smoke] [-runs 100]
// [-burst 2000] [-sweep 1000] [-only footprint,cost,...] [-json file]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
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
	// Target is the bound the value must not exceed, when there is one,
	// or must reach when Floor.
	Target *float64 `json:"target,omitempty"`
	Floor  bool     `json:"floor,omitempty"`
	Met    *bool    `json:"met,omitempty"`
	Note   string   `json:"note,omitempty"`
	// Docs is the value docs/benchmarks.json holds for the same figure.
	Docs *float64 `json:"docs,omitempty"`
}

// Results is what a benchmark run writes.
type Results struct {
	When    time.Time `json:"when"`
	CPUs    int       `json:"cpus"`
	Go      string    `json:"go"`
	Smoke   bool      `json:"smoke,omitempty"`
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
	// python runs the trainer's data check bench (the trainer's
	// virtualenv).
	python string
}

// add records a figure; target < 0 means none. A missed target says by how
// much in the note.
func (b *bench) add(section, name string, value float64, unit string, target float64, note string) {
	b.addFigure(Figure{Section: section, Name: name, Value: value, Unit: unit, Note: note}, target)
}

// addAtLeast records a figure whose target is a floor.
func (b *bench) addAtLeast(section, name string, value float64, unit string, floor float64, note string) {
	b.addFigure(Figure{Section: section, Name: name, Value: value, Unit: unit, Note: note, Floor: true}, floor)
}

func (b *bench) addFigure(f Figure, target float64) {
	if target >= 0 {
		met := f.Value <= target
		if f.Floor {
			met = f.Value >= target
		}
		f.Target, f.Met = &target, &met
		if !met {
			note := f.Note
			f.Note = fmt.Sprintf("missed by %s %s", trim(math.Abs(f.Value-target)), f.Unit)
			if target > 0 {
				f.Note += fmt.Sprintf(" (%.0f %% %s)", math.Abs(f.Value-target)/target*100, map[bool]string{false: "over", true: "under"}[f.Floor])
			}
			if note != "" {
				f.Note += "; " + note
			}
		}
	}
	b.res.Figures = append(b.res.Figures, f)
	fmt.Fprintf(os.Stderr, "bench: %s / %s = %s %s\n", f.Section, f.Name, trim(f.Value), f.Unit)
}

func trim(v float64) string {
	s := fmt.Sprintf("%.3f", v)
	s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	if s == "" || s == "-" {
		return "0"
	}
	return s
}

// sizes are how much each section measures.
type sizes struct {
	runs, lanes, burst, burstClusters, sweep, footprint, fanout, fanoutClusters, datacheckRows int
}

// smokeSizes are -smoke's: every section, small.
var smokeSizes = sizes{runs: 4, lanes: 2, burst: 100, burstClusters: 5, sweep: 50, footprint: 1, fanout: 10, fanoutClusters: 2, datacheckRows: 20}

// sectionNames are the sections, in the order they run.
var sectionNames = []string{"footprint", "cost", "latency", "sweep", "fanout", "throughput", "datacheck"}

func main() {
	var z sizes
	flag.IntVar(&z.runs, "runs", 100, "runs for the latency figures")
	flag.IntVar(&z.lanes, "lanes", 4, "clusters the latency runs share, one run at a time on each")
	flag.IntVar(&z.burst, "burst", 2000, "specs uploaded at once for each throughput burst")
	flag.IntVar(&z.burstClusters, "burst-clusters", 10, "clusters the first burst's specs spread over (the second puts them all on one)")
	flag.IntVar(&z.sweep, "sweep", 1000, "active runs the sweep figures sweep")
	flag.IntVar(&z.footprint, "footprint-trials", 5, "process starts per function for the footprint figures")
	flag.IntVar(&z.fanout, "fanout-trials", 100, "trials of the sweep the fan-out figures drop")
	flag.IntVar(&z.fanoutClusters, "fanout-clusters", 8, "clusters that sweep's trials run on, one each at a time")
	flag.IntVar(&z.datacheckRows, "datacheck-rows", 2000, "rows the data check bench checks")
	smoke := flag.Bool("smoke", false, "every section small (overrides the sizes): checks that each still runs and produces its figures")
	only := flag.String("only", strings.Join(sectionNames, ","), "sections to run, comma-separated")
	jsonOut := flag.String("json", "", "write the figures as JSON to this file")
	baseline := flag.String("baseline", "", "the figures to print beside today's (default: the repository's docs/benchmarks.json)")
	keep := flag.Bool("keep", false, "keep the local cloud's logs")
	repo := flag.String("repo", "../..", "the repository root")
	docsFrom := flag.String("update-docs", "", "make this results file (a full run's -json) the baseline, render its table into "+DocsFile+", and exit")
	flag.Parse()
	if *docsFrom != "" {
		if err := updateDocs(*repo, *docsFrom); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	if *smoke {
		z = smokeSizes
	}
	sections := strings.Split(*only, ",")
	for _, s := range sections {
		if !slices.Contains(sectionNames, s) {
			fmt.Fprintf(os.Stderr, "bench: -only: no section %q (the sections: %s)\n", s, strings.Join(sectionNames, ", "))
			os.Exit(2)
		}
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *repo, z, *smoke, sections, *jsonOut, *baseline, *keep); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, repo string, z sizes, smoke bool, sections []string, jsonOut, baseline string, keep bool) error {
	repo, err := filepath.Abs(repo)
	if err != nil {
		return err
	}
	if baseline == "" {
		baseline = filepath.Join(repo, BaselineFile)
	}
	docs, err := readResults(baseline)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	python := os.Getenv("RAYDROP_TRAINER_PYTHON")
	if slices.Contains(sections, "datacheck") && python == "" {
		return errors.New("the datacheck section needs RAYDROP_TRAINER_PYTHON (the trainer's virtualenv) and RAYDROP_GEMMA3_TOKENIZER: run it through make bench")
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
	b := &bench{ctx: ctx, st: st, repo: repo, logDir: logDir, python: python,
		res: Results{When: time.Now().UTC(), CPUs: runtime.NumCPU(), Go: runtime.Version(), Smoke: smoke}}
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

	steps := map[string]func() error{
		"footprint": func() error { return b.footprint(z.footprint) },
		"cost":      b.cost,
		"latency":   func() error { return b.latency(z.runs, z.lanes) },
		"sweep":     func() error { return b.sweep(z.sweep) },
		"fanout":    func() error { return b.fanout(z.fanout, z.fanoutClusters) },
		"throughput": func() error {
			if err := b.throughput(z.burst, z.burstClusters, "tp"); err != nil {
				return err
			}
			return b.throughput(z.burst, 1, "tp1")
		},
		"datacheck": func() error { return b.datacheck(z.datacheckRows) },
	}
	for _, name := range sectionNames {
		if !slices.Contains(sections, name) {
			continue
		}
		fmt.Fprintf(os.Stderr, "bench: --- %s ---\n", name)
		t0 := time.Now()
		before := len(b.res.Figures)
		if err := steps[name](); err != nil {
			return fmt.Errorf("%s: %w (local cloud logs in %s)", name, err, logDir)
		}
		if len(b.res.Figures) == before {
			return fmt.Errorf("%s: the section produced no figure", name)
		}
		fmt.Fprintf(os.Stderr, "bench: %s took %.0f s\n", name, time.Since(t0).Seconds())
	}
	if err := b.writeRate(); err != nil {
		return err
	}
	b.res.compare(docs)
	b.print(os.Stdout, baseline, docs)
	if jsonOut != "" {
		if err := b.res.write(jsonOut); err != nil {
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

// print writes the table, each figure beside the baseline's.
func (b *bench) print(w io.Writer, baseline string, docs *Results) {
	fmt.Fprintf(w, "\nraydrop control plane on the local cloud (%d CPUs, %s, %s)\n", b.res.CPUs, b.res.Go, b.res.When.Format(time.RFC3339))
	if docs != nil {
		fmt.Fprintf(w, "docs: %s (%d CPUs, %s); the two compare only on the same kind of machine, idle both times\n", baseline, docs.CPUs, docs.When.Format("2006-01-02"))
	}
	if b.res.Smoke {
		fmt.Fprintln(w, "smoke: every section small; its figures are not comparable to the docs'")
	}
	fmt.Fprintf(w, "\n%-11s %-52s %12s %12s %-8s %10s %s\n", "section", "figure", "value", "docs", "unit", "target", "")
	for _, f := range b.res.Figures {
		target, verdict, doc := "", "", "—"
		if f.Target != nil {
			target = f.bound()
			verdict = "met"
			if !*f.Met {
				verdict = "MISSED"
			}
		}
		if f.Docs != nil {
			doc = trim(*f.Docs)
		}
		fmt.Fprintf(w, "%-11s %-52s %12s %12s %-8s %10s %s\n", f.Section, f.Name, trim(f.Value), doc, f.Unit, target, verdict)
		if f.Note != "" {
			fmt.Fprintf(w, "%-11s   %s\n", "", f.Note)
		}
	}
}
