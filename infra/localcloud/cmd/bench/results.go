package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// BaselineFile holds the figures docs/benchmarks.md quotes (DocsFile's
// table is rendered from it): a full make bench on an idle machine,
// written by make bench-docs.
const (
	BaselineFile = "docs/benchmarks.json"
	DocsFile     = "docs/benchmarks.md"
)

// The markers around the table of DocsFile that renderTable writes.
const (
	tableBegin = "<!-- figures: rendered from benchmarks.json by make bench-docs; do not edit by hand -->"
	tableEnd   = "<!-- end of figures -->"
)

// key names a figure across runs.
func (f Figure) key() string { return f.Section + "\x00" + f.Name }

// bound is the target as printed: ≤ or ≥ it.
func (f Figure) bound() string {
	if f.Target == nil {
		return ""
	}
	if f.Floor {
		return "≥ " + trim(*f.Target)
	}
	return "≤ " + trim(*f.Target)
}

// readResults reads a results file; a missing file is no baseline (nil).
func readResults(path string) (*Results, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var r Results
	if err := json.Unmarshal(data, &r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return &r, nil
}

// write writes the results as indented JSON.
func (r *Results) write(path string) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	return os.WriteFile(path, append(data, '\n'), 0o644)
}

// compare sets each figure's Docs to the baseline's value of the same
// figure, where it has one.
func (r *Results) compare(docs *Results) {
	if docs == nil {
		return
	}
	was := map[string]float64{}
	for _, f := range docs.Figures {
		was[f.key()] = f.Value
	}
	for i, f := range r.Figures {
		if v, ok := was[f.key()]; ok {
			r.Figures[i].Docs = &v
		}
	}
}

// renderTable is the Markdown table of the results that DocsFile quotes.
func renderTable(r *Results) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Measured by `make bench` on %s, %d CPUs, %s, nothing else running:\n\n", r.When.Format("2006-01-02"), r.CPUs, r.Go)
	b.WriteString("| section | figure | value | target | note |\n| --- | --- | --- | --- | --- |\n")
	for _, f := range r.Figures {
		verdict := ""
		if f.Met != nil {
			verdict = ": met"
			if !*f.Met {
				verdict = ": **missed**"
			}
		}
		target := strings.TrimSpace(f.bound() + " " + f.Unit)
		if f.Target == nil {
			target = ""
		}
		note := strings.ReplaceAll(f.Note, "|", "\\|")
		fmt.Fprintf(&b, "| %s | %s | %s %s | %s%s | %s |\n", f.Section, f.Name, trim(f.Value), f.Unit, target, verdict, note)
	}
	return b.String()
}

// renderDocs returns doc with the table between the markers replaced by
// the rendering of r.
func renderDocs(doc []byte, r *Results) ([]byte, error) {
	i, j := bytes.Index(doc, []byte(tableBegin)), bytes.Index(doc, []byte(tableEnd))
	if i < 0 || j < i {
		return nil, fmt.Errorf("%s has no %q … %q block", DocsFile, tableBegin, tableEnd)
	}
	var out bytes.Buffer
	out.Write(doc[:i+len(tableBegin)])
	out.WriteString("\n\n" + renderTable(r) + "\n")
	out.Write(doc[j:])
	return out.Bytes(), nil
}

// updateDocs makes the full run in from the new baseline: it copies it to
// BaselineFile and renders its table into DocsFile.
func updateDocs(repo, from string) error {
	r, err := readResults(from)
	if err != nil {
		return err
	}
	if r == nil {
		return fmt.Errorf("%s: no such file: run make bench first", from)
	}
	if r.Smoke {
		return fmt.Errorf("%s is a smoke run: the docs quote a full make bench", from)
	}
	for i := range r.Figures {
		r.Figures[i].Docs = nil
	}
	docPath := filepath.Join(repo, DocsFile)
	doc, err := os.ReadFile(docPath)
	if err != nil {
		return err
	}
	if doc, err = renderDocs(doc, r); err != nil {
		return err
	}
	if err := r.write(filepath.Join(repo, BaselineFile)); err != nil {
		return err
	}
	return os.WriteFile(docPath, doc, 0o644)
}
