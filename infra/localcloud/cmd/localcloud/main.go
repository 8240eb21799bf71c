// Command localcloud runs raydrop's whole pipeline on this machine.
//
//	localcloud run [SPEC]   start the stack, drop SPEC (default the example) into the
//	                        intake bucket, follow the run to its end, print the completion
//	                        event, check the workers are gone, stop everything
//	localcloud dev          start the stack and keep it up until Ctrl-C, printing the
//	                        variables that point clients at it
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/storage"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/raydrop/raydrop/examples/shapes"
	"github.com/raydrop/raydrop/infra/localcloud/stack"
	"github.com/raydrop/raydrop/pkg/cli"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}

func run(ctx context.Context, args []string) int {
	fs := flag.NewFlagSet("localcloud", flag.ContinueOnError)
	repo := fs.String("repo", "../..", "repository root")
	tick := fs.Duration("tick", 2*time.Second, "scheduler tick interval")
	timeout := fs.Duration("timeout", 5*time.Minute, "longest the run may take (run mode)")
	verbose := fs.Bool("v", false, "log the stack's internals")
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "usage: localcloud run [SPEC] | localcloud dev")
		return 2
	}
	mode := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	specFile := filepath.Join(*repo, "examples", "gemma3-vision.json")
	if fs.NArg() > 0 {
		specFile = fs.Arg(0)
	}
	data, err := os.ReadFile(specFile)
	if err != nil {
		fmt.Fprintf(os.Stderr, "localcloud: %v\n", err)
		return 1
	}
	s, err := spec.Parse(data)
	if err != nil {
		fmt.Fprintf(os.Stderr, "localcloud: %s is not a valid spec: %v\n", specFile, err)
		return 1
	}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if *verbose {
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	st, err := stack.Start(ctx, stack.Options{Repo: *repo, Tick: *tick, OutputBuckets: []string{s.Output.Bucket}, Log: log, Progress: os.Stdout, Kueue: true})
	if err != nil {
		fmt.Fprintf(os.Stderr, "localcloud: %v\n", err)
		return 1
	}
	defer func() {
		fmt.Println("localcloud: stopping every process it started")
		st.Stop()
	}()
	if err := uploadShapes(ctx, st.GCS, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "localcloud: %v\n", err)
		return 1
	}
	switch mode {
	case "dev":
		fmt.Println("localcloud: up. Point clients at it with:")
		for _, e := range st.Env() {
			fmt.Println("  export " + e)
		}
		fmt.Printf("  # intake bucket %s, state bucket %s, topics raydrop-requests, raydrop-events, …\n", stack.IntakeBucket, stack.StateBucket)
		fmt.Println("localcloud: Ctrl-C stops it")
		<-ctx.Done()
		return 0
	case "run":
		rctx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		if err := demo(rctx, st, specFile, data, filepath.Join(*repo, ".build", "run-report.html")); err != nil {
			st.KeepState()
			fmt.Fprintf(os.Stderr, "localcloud: %v (logs in %s)\n", err, st.StateDir())
			return 1
		}
		return 0
	}
	fmt.Fprintf(os.Stderr, "localcloud: unknown mode %q (run or dev)\n", mode)
	return 2
}

// The example dataset the local cloud puts in its data bucket, where
// examples/shapes.json reads it: how many images, drawn from which seed.
const (
	shapesImages = 300
	shapesSeed   = 1
)

// uploadShapes writes the example dataset (examples/shapes) to
// gs://DataBucket/shapes/, as a user would copy their own folder there,
// and says so on out.
func uploadShapes(ctx context.Context, gcs *storage.Client, out io.Writer) error {
	files, err := shapes.Files(shapesImages, shapesSeed)
	if err != nil {
		return err
	}
	objects := make([]string, 0, len(files))
	for name := range files {
		objects = append(objects, name)
	}
	sort.Strings(objects)
	bucket := gcs.Bucket(stack.DataBucket)
	for _, name := range objects {
		object := shapes.Folder + "/" + name
		w := bucket.Object(object).NewWriter(ctx)
		w.ContentType = "image/png"
		if path.Ext(name) == ".jsonl" {
			w.ContentType = "application/jsonl"
		}
		if _, err := w.Write(files[name]); err != nil {
			_ = w.Close()
			return fmt.Errorf("upload gs://%s/%s: %w", stack.DataBucket, object, err)
		}
		if err := w.Close(); err != nil {
			return fmt.Errorf("upload gs://%s/%s: %w", stack.DataBucket, object, err)
		}
	}
	fmt.Fprintf(out, "localcloud: example dataset gs://%s/%s/: %d images and metadata.jsonl (examples/shapes.json trains on it)\n", stack.DataBucket, shapes.Folder, shapesImages)
	return nil
}

// demo drops the spec into the intake bucket and follows the run.
func demo(ctx context.Context, st *stack.Stack, specFile string, data []byte, reportFile string) error {
	sub := "raydrop-events-localcloud"
	evs := make(chan *pubsubpb.PubsubMessage, 64)
	if err := st.PubSub.Tap(ctx, stack.Topics.Events, sub, func(_ context.Context, m *pubsubpb.PubsubMessage) bool {
		evs <- m
		return true
	}); err != nil {
		return fmt.Errorf("subscribe to events: %w", err)
	}

	object := "jobs/" + filepath.Base(specFile)
	w := st.GCS.Bucket(stack.IntakeBucket).Object(object).NewWriter(ctx)
	w.ContentType = "application/json"
	// The simulated Ray job: 3 epochs of 4 steps, slow enough to watch.
	w.Metadata = map[string]string{stack.SimMetadata: "steps=4,step=700ms"}
	if _, err := w.Write(data); err != nil {
		return err
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("upload %s: %w", object, err)
	}
	runID := names.RunIDFromObject(stack.IntakeBucket, object, w.Attrs().Generation)
	fmt.Printf("uploaded gs://%s/%s → run %s\n", stack.IntakeBucket, object, runID)

	store := &runs.Store{Bucket: st.GCS.Bucket(stack.StateBucket)}
	// The completion event, then the report's own event after it.
	var final, reported *events.Run
	lastPhase, lastStep := runs.Phase(""), int64(-1)
	start := time.Now()
	poll := time.NewTicker(300 * time.Millisecond)
	defer poll.Stop()
	for final == nil || reported == nil {
		select {
		case <-ctx.Done():
			if final != nil {
				return fmt.Errorf("run %s ended %s, and no %s event came in time", runID, final.Phase, events.ReportReady)
			}
			return fmt.Errorf("run %s did not end in time (phase %s)", runID, lastPhase)
		case m := <-evs:
			e, err := events.FromPubSub(m.Attributes, m.Data)
			if err != nil {
				return fmt.Errorf("bad event: %w", err)
			}
			fmt.Printf("%6.1fs  event %s\n", time.Since(start).Seconds(), e.Type())
			var d events.Run
			_ = json.Unmarshal(e.Data(), &d)
			switch {
			case events.Terminal[d.Phase]:
				final = &d
				pretty, _ := json.MarshalIndent(d, "", "  ")
				fmt.Printf("completion event %s (id %s):\n%s\n", e.Type(), e.ID(), pretty)
			case d.Phase == events.ReportReady:
				reported = &d
				fmt.Printf("report ready: %s\n", d.Report)
			}
		case <-poll.C:
			r, err := store.Get(ctx, runID)
			if errors.Is(err, runs.ErrNotFound) {
				continue
			} else if err != nil {
				return err
			}
			if r.Phase != lastPhase {
				if lastPhase == runs.Checking && r.Check != nil && r.Check.Result != nil {
					fmt.Printf("%6.1fs  data check %s\n", time.Since(start).Seconds(), cli.CheckText(r))
				}
				fmt.Printf("%6.1fs  phase %s %s\n", time.Since(start).Seconds(), r.Phase, r.Message)
				lastPhase = r.Phase
			}
			if p := r.Progress; p != nil && p.Step != lastStep {
				loss := ""
				if p.Loss != nil {
					loss = fmt.Sprintf(" loss %.3f", *p.Loss)
				}
				fmt.Printf("%6.1fs  training step %d epoch %.2f%s\n", time.Since(start).Seconds(), p.Step, p.Epoch, loss)
				lastStep = p.Step
			}
		}
	}
	if final.Phase != "succeeded" {
		return fmt.Errorf("run %s ended %s: %s", runID, final.Phase, final.Message)
	}
	for _, c := range final.Checkpoints {
		bucket, prefix, _ := strings.Cut(strings.TrimPrefix(c.URI, "gs://"), "/")
		if _, err := st.GCS.Bucket(bucket).Object(prefix + "/adapter_model.safetensors").Attrs(ctx); err != nil {
			return fmt.Errorf("checkpoint %s: %w", c.URI, err)
		}
		fmt.Printf("checkpoint %s (step %d, epoch %g): adapter present\n", c.URI, c.Step, c.Epoch)
	}
	if err := saveReport(ctx, st, reported.Report, reportFile); err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(st.Sim.Config)
	if err != nil {
		return err
	}
	for {
		pods, err := kube.CoreV1().Pods(metav1.NamespaceAll).List(ctx, metav1.ListOptions{LabelSelector: "ray.io/node-type=worker"})
		if err != nil {
			return err
		}
		if len(pods.Items) == 0 {
			fmt.Println("worker pods: 0 (scaled to zero)")
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d worker pods still running", len(pods.Items))
		case <-time.After(300 * time.Millisecond):
		}
	}
}

// saveReport copies the run's report, which its report_ready event names,
// from the bucket to file, to open in a browser.
func saveReport(ctx context.Context, st *stack.Stack, uri, file string) error {
	bucket, name, ok := strings.Cut(strings.TrimPrefix(uri, "gs://"), "/")
	if !ok || !strings.HasPrefix(uri, "gs://") {
		return fmt.Errorf("the completion event names no report (%q)", uri)
	}
	rd, err := st.GCS.Bucket(bucket).Object(name).NewReader(ctx)
	if err != nil {
		return fmt.Errorf("report %s: %w", uri, err)
	}
	defer func() { _ = rd.Close() }()
	page, err := io.ReadAll(rd)
	if err != nil {
		return fmt.Errorf("report %s: %w", uri, err)
	}
	if file, err = filepath.Abs(file); err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(file, page, 0o644); err != nil {
		return err
	}
	fmt.Printf("report %s (%d bytes) copied to %s: open it in a browser\n", uri, len(page), file)
	return nil
}
