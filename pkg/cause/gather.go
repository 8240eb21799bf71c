package cause

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"

	"golang.org/x/sync/errgroup"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Limits of what Gather reads.
const (
	// maxJSON bounds pods.json and events.json.
	maxJSON = 16 << 20
	// maxLog bounds a log file: the capture keeps 2 MiB of each container
	// log by default, the raylogs sidecar 8 MiB of each Ray log.
	maxLog = 9 << 20
	// maxRayFiles bounds how many Ray log files one gather reads, and
	// parallelReads how many it reads at once.
	maxRayFiles   = 64
	parallelReads = 8
)

// Gather adds to in what an attempt's evidence folder (an object prefix,
// evidence.AttemptFolder) in st holds: the pods' statuses, the events, the
// driver's output (the submitter pod's log); then, when those name no
// cause of their own, the ranks' and raylets' Ray logs the pods' sidecars
// copied (ray/<pod>/worker-*.err|out, raylet.out). What is missing is
// skipped: a cause is named from what there is. The error is the first
// object that could be listed or read but not made sense of.
func Gather(ctx context.Context, st checkpoints.Store, folder string, in *Input) error {
	return gather(ctx, st, folder, in, false)
}

// gather is Gather; with rays, it reads the Ray logs whatever the rest
// shows.
func gather(ctx context.Context, st checkpoints.Store, folder string, in *Input, rays bool) error {
	var first error
	note := func(err error) {
		if err != nil && !errors.Is(err, checkpoints.ErrNotFound) && first == nil {
			first = err
		}
	}
	note(readJSON(ctx, st, folder+"/pods.json", &in.Pods))
	note(readJSON(ctx, st, folder+"/events.json", &in.Events))
	var m evidence.Manifest
	note(readJSON(ctx, st, folder+"/"+evidence.ManifestFile, &m))
	for _, f := range m.Files {
		// The submitter pod is named after the RayJob; its one container
		// runs `ray job submit`, which tails the driver's output.
		if f.Kind != evidence.KindLog || f.Previous || m.RayJob == "" || !strings.HasPrefix(f.Pod, m.RayJob+"-") {
			continue
		}
		text, err := readLog(ctx, st, folder+"/"+f.Path)
		note(err)
		if err == nil {
			// No pod: the driver runs on the head, and the submitter only
			// tails its output; a worker's line names its own by IP.
			in.Logs = append(in.Logs, Log{Source: f.Path, Text: text})
		}
	}
	if in.Reason == runs.Stalled {
		stacks, err := ReadStacks(ctx, st, folder)
		note(err)
		in.Stacks = stacks
	}
	if c := Classify(*in); !rays && c.Source != "" && c.Source != markSource && Kind(c.Kind) != PythonException {
		return first
	}
	note(rayLogs(ctx, st, folder, in))
	return first
}

// rayLogs adds the Ray logs the pods' sidecars copied: each rank's stderr
// and stdout, then the raylets', pod by pod.
func rayLogs(ctx context.Context, st checkpoints.Store, folder string, in *Input) error {
	prefix := folder + "/" + evidence.RayFolder + "/"
	names, err := st.List(ctx, prefix)
	if err != nil {
		return err
	}
	// class orders the files: the ranks' stderr, their stdout, the raylets'.
	class := func(n string) int {
		switch b := path.Base(n); {
		case strings.HasPrefix(b, "worker-") && strings.HasSuffix(b, ".err"):
			return 0
		case strings.HasPrefix(b, "worker-") && strings.HasSuffix(b, ".out"):
			return 1
		case b == "raylet.out":
			return 2
		}
		return -1
	}
	var picked []string
	for _, n := range names {
		if class(n) >= 0 {
			picked = append(picked, n)
		}
	}
	sort.SliceStable(picked, func(i, j int) bool {
		if ci, cj := class(picked[i]), class(picked[j]); ci != cj {
			return ci < cj
		}
		return picked[i] < picked[j]
	})
	if len(picked) > maxRayFiles {
		picked = picked[:maxRayFiles]
	}
	// Read a few at once (a 16-rank run has some 35 files), kept in order.
	texts := make([]string, len(picked))
	errs := make([]error, len(picked))
	g := errgroup.Group{}
	g.SetLimit(parallelReads)
	for i, n := range picked {
		g.Go(func() error {
			b, err := st.Read(ctx, n, maxLog)
			texts[i], errs[i] = string(b), err
			return nil
		})
	}
	_ = g.Wait()
	var first error
	for i, n := range picked {
		if err := errs[i]; err != nil {
			if first == nil && !errors.Is(err, checkpoints.ErrNotFound) {
				first = err
			}
			continue
		}
		rel := strings.TrimPrefix(n, folder+"/")
		pod, _, _ := strings.Cut(strings.TrimPrefix(n, prefix), "/")
		in.Logs = append(in.Logs, Log{Source: rel, Pod: pod, Text: texts[i]})
	}
	return first
}

func readJSON(ctx context.Context, st checkpoints.Store, name string, into any) error {
	b, err := st.Read(ctx, name, maxJSON)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, into); err != nil {
		return fmt.Errorf("parse %s: %w: %w", st.URI(name), checkpoints.ErrUnreadable, err)
	}
	return nil
}

// readLog reads a gzipped container log of the evidence.
func readLog(ctx context.Context, st checkpoints.Store, name string) (string, error) {
	b, err := st.Read(ctx, name, maxLog)
	if err != nil {
		return "", err
	}
	zr, err := gzip.NewReader(bytes.NewReader(b))
	if err != nil {
		return "", fmt.Errorf("%s: %w: %w", st.URI(name), checkpoints.ErrUnreadable, err)
	}
	out, err := io.ReadAll(io.LimitReader(zr, maxLog))
	if err != nil {
		return "", fmt.Errorf("%s: %w: %w", st.URI(name), checkpoints.ErrUnreadable, err)
	}
	return string(out), nil
}
