package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestDocsQuoteTheBaseline: docs/benchmarks.md's table is the rendering of
// docs/benchmarks.json, the figures make bench prints beside its own, and
// that baseline is a full run of every section: the docs cannot quote a
// figure no run produced.
func TestDocsQuoteTheBaseline(t *testing.T) {
	repo := filepath.Join("..", "..", "..", "..")
	r, err := readResults(filepath.Join(repo, BaselineFile))
	if err != nil || r == nil {
		t.Fatalf("baseline %s: %v (missing: run make bench, then make bench-docs)", BaselineFile, err)
	}
	if r.Smoke {
		t.Errorf("%s is a smoke run; the docs quote a full make bench", BaselineFile)
	}
	for _, s := range sectionNames {
		if !slices.ContainsFunc(r.Figures, func(f Figure) bool { return f.Section == s }) {
			t.Errorf("%s has no figure of section %s", BaselineFile, s)
		}
	}
	doc, err := os.ReadFile(filepath.Join(repo, DocsFile))
	if err != nil {
		t.Fatal(err)
	}
	want, err := renderDocs(doc, r)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(doc) {
		t.Errorf("%s's table is not the rendering of %s: run make bench-docs", DocsFile, BaselineFile)
	}
}

// TestCompare: a figure gets the baseline's value of the same section and
// name, and none where the baseline lacks it.
func TestCompare(t *testing.T) {
	r := &Results{Figures: []Figure{{Section: "sweep", Name: "sweep time", Value: 1.2}, {Section: "sweep", Name: "new", Value: 3}}}
	r.compare(&Results{Figures: []Figure{{Section: "sweep", Name: "sweep time", Value: 1.6}, {Section: "cost", Name: "new", Value: 9}}})
	if r.Figures[0].Docs == nil || *r.Figures[0].Docs != 1.6 {
		t.Errorf("sweep time: docs %v, want 1.6", r.Figures[0].Docs)
	}
	if r.Figures[1].Docs != nil {
		t.Errorf("a figure the baseline lacks got docs %v", *r.Figures[1].Docs)
	}
}
