package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"cloud.google.com/go/storage"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/runs"
)

// runLogs prints an attempt's driver log, which the trainer copies beside
// the run (<attempt>/driver.log, every 15 s and when it ends), so it is
// there while the cluster is up and after it has scaled down.
func runLogs(ctx context.Context, e *env, args []string) int {
	fs, t := deploymentFlags(e, "logs")
	attempt := fs.Int("attempt", 0, "the attempt (default: the run's current one)")
	follow := fs.Bool("follow", false, "keep printing new lines until the attempt ends")
	interval := fs.Duration("interval", 2*time.Second, "how often --follow looks for new lines")
	var po podLogOptions
	fs.StringVar(&po.pod, "pod", "", "print a live pod's container log instead, read through the Kubernetes API server: one of the run's Ray pods or its submitter")
	fs.StringVar(&po.container, "container", "", "with --pod: the container (default: the pod's only or first one)")
	fs.BoolVar(&po.previous, "previous", false, "with --pod: the container's previous instance, before it restarted")
	fs.Int64Var(&po.tail, "tail", -1, "with --pod: only the last N lines")
	fs.StringVar(&po.kubeconfig, "kubeconfig", "", "with --pod: the cluster's kubeconfig (default: $KUBECONFIG, then ~/.kube/config)")
	st, r, done, code, ok := oneRun(ctx, e, "logs", fs, t, args)
	if !ok {
		return code
	}
	defer done()
	if *interval <= 0 {
		fmt.Fprintln(e.stderr, "raydrop logs: --interval must be positive")
		return ExitUsage
	}
	if po.pod == "" && (po.container != "" || po.previous || po.tail >= 0 || po.kubeconfig != "") {
		fmt.Fprintln(e.stderr, "raydrop logs: --container, --previous, --tail and --kubeconfig go with --pod")
		return ExitUsage
	}
	if po.pod != "" {
		if *attempt != 0 {
			fmt.Fprintln(e.stderr, "raydrop logs: --attempt is for the driver's log; --pod reads a live pod")
			return ExitUsage
		}
		po.follow = *follow
		return runPodLogs(ctx, e, r, po)
	}
	n := *attempt
	if n == 0 {
		n = r.Attempt
	}
	switch {
	case r.Spec == nil || r.Attempt == 0:
		return fail(e, "logs", fmt.Errorf("run %s (%s) has started no Ray job: it has no driver log", r.RunID, r.Phase))
	case n < 1 || n > r.Attempt:
		return fail(e, "logs", fmt.Errorf("run %s has attempts 1 to %d, not %d", r.RunID, r.Attempt, n))
	}
	bucket, exp := manifests.Experiment(r.Spec, r.RunID, n)
	obj := t.client.Bucket(bucket).Object(exp + "/" + checkpoints.DriverLogFile)
	var offset int64
	for {
		printed, err := printFrom(ctx, obj, offset, e.stdout)
		offset += printed
		if err != nil && !errors.Is(err, storage.ErrObjectNotExist) {
			return fail(e, "logs", friendly(err, t))
		}
		if !*follow || attemptOver(r, n) {
			if offset == 0 {
				return fail(e, "logs", fmt.Errorf("no driver log for attempt %d of run %s yet at gs://%s/%s/%s (the trainer copies it every 15 s)", n, r.RunID, bucket, exp, checkpoints.DriverLogFile))
			}
			return ExitOK
		}
		select {
		case <-ctx.Done():
			return ExitOK
		case <-time.After(*interval):
		}
		// The record says whether the attempt is over; the last copy of its
		// log is printed after that, so no line is missed.
		if r, err = st.Get(ctx, r.RunID); err != nil {
			return fail(e, "logs", friendly(err, t))
		}
	}
}

// attemptOver reports whether attempt n of the run has ended: a later
// attempt started, or the run ended.
func attemptOver(r *runs.Record, n int) bool {
	return r.Attempt > n || r.Phase.Terminal()
}

// printFrom copies the object from offset to w and returns how many bytes
// it copied. The trainer rewrites the whole log each time, and it only
// grows, so what was printed stays a prefix.
func printFrom(ctx context.Context, obj *storage.ObjectHandle, offset int64, w io.Writer) (int64, error) {
	rd, err := obj.NewRangeReader(ctx, offset, -1)
	if err != nil {
		var size int64
		if a, aerr := obj.Attrs(ctx); aerr == nil {
			size = a.Size
		}
		if size == offset { // nothing new: Cloud Storage answers 416 for a range at the end
			return 0, nil
		}
		return 0, err
	}
	defer func() { _ = rd.Close() }()
	return io.Copy(w, rd)
}
