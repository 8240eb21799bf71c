// Package proof holds the reliability and security suite of the local
// cloud: the pipeline under duplicated, lost and late messages, function
// processes killed mid-handler, API server conflicts and outages, bad input
// of every kind, and a planted Hugging Face token that must never come out.
// The suite is in proof_test.go and its siblings; this file holds the
// per-scenario report it prints and writes.
package proof

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"sync"
)

// Row is one scenario's line of the report.
type Row struct {
	Scenario string `json:"scenario"`
	// Trials is the number of runs (or inputs) the scenario put through.
	Trials int `json:"trials"`
	// Passed is the number of trials that ended as the design says.
	Passed int `json:"passed"`
	// Duplicates counts side effects beyond one per run: extra RayJobs,
	// extra accepted or terminal events.
	Duplicates int `json:"duplicates"`
	// Orphans counts runs left unfinished and clusters left with workers.
	Orphans int `json:"orphans"`
	// DeadLettered counts messages the scenario's phase sent to a
	// dead-letter topic.
	DeadLettered int      `json:"deadLettered"`
	Notes        []string `json:"notes,omitempty"`
}

// Report is the suite's report, safe for concurrent use.
type Report struct {
	mu   sync.Mutex
	rows map[string]*Row
}

// Add records one trial of a scenario; problems empty means it passed.
func (r *Report) Add(scenario string, dups, orphans int, problems ...string) {
	r.update(scenario, func(row *Row) {
		row.Trials++
		if len(problems) == 0 {
			row.Passed++
		}
		row.Duplicates += dups
		row.Orphans += orphans
		row.Notes = append(row.Notes, problems...)
	})
}

// Note adds a note to a scenario.
func (r *Report) Note(scenario, note string) {
	r.update(scenario, func(row *Row) { row.Notes = append(row.Notes, note) })
}

// DeadLettered adds dead-lettered messages to a scenario.
func (r *Report) DeadLettered(scenario string, n int) {
	r.update(scenario, func(row *Row) { row.DeadLettered += n })
}

func (r *Report) update(scenario string, f func(*Row)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.rows == nil {
		r.rows = map[string]*Row{}
	}
	row, ok := r.rows[scenario]
	if !ok {
		row = &Row{Scenario: scenario}
		r.rows[scenario] = row
	}
	f(row)
}

// Rows returns the rows sorted by scenario.
func (r *Report) Rows() []Row {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Row, 0, len(r.rows))
	for _, row := range r.rows {
		out = append(out, *row)
	}
	slices.SortFunc(out, func(a, b Row) int { return strings.Compare(a.Scenario, b.Scenario) })
	return out
}

// Print writes the report as a table.
func (r *Report) Print(w io.Writer) {
	fmt.Fprintf(w, "%-34s %6s %6s %10s %7s %12s\n", "scenario", "trials", "passed", "duplicates", "orphans", "deadLettered")
	for _, row := range r.Rows() {
		fmt.Fprintf(w, "%-34s %6d %6d %10d %7d %12d\n", row.Scenario, row.Trials, row.Passed, row.Duplicates, row.Orphans, row.DeadLettered)
		for _, n := range row.Notes {
			fmt.Fprintf(w, "    %s\n", n)
		}
	}
}

// Write writes the report as JSON to path.
func (r *Report) Write(path string) error {
	b, err := json.MarshalIndent(r.Rows(), "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}
