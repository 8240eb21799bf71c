package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// datacheckResult is the last line datacheck_bench.py prints.
type datacheckResult struct {
	Datacheck []struct {
		Processes            int     `json:"processes"`
		Rows                 int     `json:"rows"`
		Seconds              float64 `json:"seconds"`
		RowsPerSecondPerCore float64 `json:"rowsPerSecondPerCore"`
		StartupSeconds       float64 `json:"startupSeconds"`
	} `json:"datacheck"`
	ExampleRunSeconds float64 `json:"exampleRunSeconds"`
}

// anchorRowsPerCore is the data check's anchor: 100,000 image rows in
// 30 s on the head's 24 CPUs.
const anchorRowsPerCore = 150

// datacheck runs the trainer's data check bench (the real datacheck.py on
// rows JPEG rows, Gemma 3's real tokenizer, 1 and 2 processes) in the
// trainer's virtualenv, and records its figures.
func (b *bench) datacheck(rows int) error {
	cmd := exec.CommandContext(b.ctx, b.python, "bench/datacheck_bench.py", "--rows", fmt.Sprint(rows), "--processes", "1,2")
	cmd.Dir = filepath.Join(b.repo, "trainer")
	cmd.Env = append(os.Environ(), "PYTHONDONTWRITEBYTECODE=1")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("%s bench/datacheck_bench.py: %w\n%s", b.python, err, out.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	var r datacheckResult
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &r); err != nil {
		return fmt.Errorf("datacheck_bench.py's last line is not its figures: %w\n%s", err, out.String())
	}
	if len(r.Datacheck) == 0 {
		return fmt.Errorf("datacheck_bench.py's figures hold no check:\n%s", out.String())
	}
	fmt.Fprint(os.Stderr, strings.Join(lines[:len(lines)-1], "\n")+"\n")
	b.add("datacheck", "fixed start-up (a check of 20 rows)", r.Datacheck[0].StartupSeconds, "s", -1, "")
	for _, d := range r.Datacheck {
		b.addAtLeast("datacheck", fmt.Sprintf("JPEG rows per second per core, %d process(es)", d.Processes), d.RowsPerSecondPerCore, "rows/s",
			anchorRowsPerCore, fmt.Sprintf("%d rows in %s s; anchor: 100,000 rows in 30 s on the head's 24 CPUs", d.Rows, trim(d.Seconds)))
	}
	b.add("datacheck", "the example run's check on the head's 24 CPUs", r.ExampleRunSeconds, "s", -1, "1,345 rows, at the best rate per core, plus the fixed start-up")
	return nil
}
