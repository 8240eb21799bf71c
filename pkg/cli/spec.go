package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// loadSpec reads and parses a spec file ("-" for standard input). It prints
// every problem to stderr and returns false when there is any.
func loadSpec(e *env, file string) (*spec.JobSpec, []byte, bool) {
	var (
		data []byte
		err  error
	)
	if file == "-" {
		data, err = io.ReadAll(io.LimitReader(e.stdin, spec.MaxBytes+1))
	} else {
		data, err = readLimited(file, spec.MaxBytes+1)
	}
	if err != nil {
		fmt.Fprintf(e.stderr, "raydrop: %v\n", err)
		return nil, nil, false
	}
	s, err := spec.Parse(data)
	if err != nil {
		var ps spec.Problems
		if errors.As(err, &ps) {
			for _, p := range ps {
				fmt.Fprintln(e.stderr, p.String())
			}
		} else {
			fmt.Fprintf(e.stderr, "raydrop: %v\n", err)
		}
		return nil, nil, false
	}
	if s.Name == "" {
		s.Name = names.SpecName(filepath.Base(file))
	}
	return s, data, true
}

func readLimited(file string, limit int64) ([]byte, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, limit))
	if err != nil {
		return nil, fmt.Errorf("read spec %s: %w", file, err)
	}
	return b, nil
}

func runValidate(_ context.Context, e *env, args []string) int {
	fs := newFlags(e, "validate")
	pos, code, ok := parse(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(e.stderr, "raydrop validate: give exactly one spec file (or - for standard input)")
		return ExitUsage
	}
	if _, _, ok := loadSpec(e, pos[0]); !ok {
		return ExitFailure
	}
	fmt.Fprintf(e.stdout, "%s: valid\n", pos[0])
	return ExitOK
}

func runRender(_ context.Context, e *env, args []string) int {
	fs := newFlags(e, "render")
	runID := fs.String("run-id", "", "run ID to render for (default: the spec's runId, else derived from the file's name and content)")
	attempt := fs.Int("attempt", 1, "attempt number (1-based)")
	resume := fs.String("resume-from", "", "checkpoint URI the attempt resumes from")
	tier := fs.Int("tier", 1, "capacity tier the workers are asked on (1-based, in cluster.capacity's order)")
	trainerImage := fs.String("trainer-image", "", "the deployment's trainer image (repository@sha256:...), to render as the pipeline does: the image of every Ray container the spec names none for, and no pip in the runtime env when both run it")
	pos, code, ok := parse(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 {
		fmt.Fprintln(e.stderr, "raydrop render: give exactly one spec file (or - for standard input)")
		return ExitUsage
	}
	s, data, ok := loadSpec(e, pos[0])
	if !ok {
		return ExitFailure
	}
	id := *runID
	switch {
	case id != "":
	case s.RunID != "":
		id = s.RunID
	default:
		id = names.RunIDFromFile(pos[0], data)
	}
	if most := s.Limits.Retries + s.Limits.Preemptions + 1; *attempt < 1 || *attempt > most {
		fmt.Fprintf(e.stderr, "raydrop render: --attempt %d is out of range (allowed: 1 to %d, limits.retries + limits.preemptions + 1)\n", *attempt, most)
		return ExitUsage
	}
	if n := len(s.Tiers()); *tier < 1 || *tier > n {
		fmt.Fprintf(e.stderr, "raydrop render: --tier %d is out of range (allowed: 1 to %d, the tiers of cluster.capacity)\n", *tier, n)
		return ExitUsage
	}
	if *trainerImage != "" {
		if msg := config.CheckTrainerImage(*trainerImage); msg != "" {
			fmt.Fprintf(e.stderr, "raydrop render: --trainer-image %q %s\n", *trainerImage, msg)
			return ExitUsage
		}
	}
	rec := runs.Record{Spec: s}
	rec.UseImages(*trainerImage) // as admission does
	code2, err := manifests.TrainerCode()
	if err != nil {
		fmt.Fprintf(e.stderr, "raydrop render: %v\n", err)
		return ExitFailure
	}
	run := manifests.Run{ID: id, Attempt: *attempt, ResumeFrom: *resume, Source: "file:" + filepath.Base(pos[0]), SpecHash: s.Hash(), Tier: *tier - 1, Preinstalled: rec.TrainerImage != ""}
	if err := run.Validate(); err != nil {
		fmt.Fprintf(e.stderr, "raydrop render: %v\n", err)
		return ExitUsage
	}
	out, err := manifests.YAML(manifests.Objects(s, run, code2))
	if err != nil {
		fmt.Fprintf(e.stderr, "raydrop render: %v\n", err)
		return ExitFailure
	}
	if _, err := e.stdout.Write(out); err != nil {
		fmt.Fprintf(e.stderr, "raydrop render: write output: %v\n", err)
		return ExitFailure
	}
	return ExitOK
}
