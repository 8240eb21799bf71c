package spec

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Sweep is a search over the spec's own fields: the spec is run once per
// trial, each trial a complete run with its parameters' values. A spec
// without sweep.parameters is one run.
type Sweep struct {
	Parameters []SweepParameter `json:"parameters" spec:"min=0,max=8" doc:"The fields varied, each by its spec path (training.learningRate, lora.r, ...): a numeric field takes values or a range (min, max, scale), an enumerated or true/false field takes choices. No field may appear twice."`
	Search     string           `json:"search" spec:"enum=grid|random" doc:"grid: every combination of the parameters' values and choices (ranges need random), at most 100; random: trials draws, each parameter drawn on its own (values and choices uniformly, ranges uniformly or log-uniformly)."`
	Trials     int              `json:"trials" spec:"min=0,max=100" doc:"For random: how many trials are drawn (1 to 100); for grid: 0 (the grid has every combination)."`
	Seed       int              `json:"seed" spec:"min=0,max=2147483647" doc:"Seed of the random draws: the same seed draws the same trials."`
	Parallel   int              `json:"parallel" spec:"min=0,max=16" doc:"Trials run at once; 0: one on each of clusters. At most the number of clusters, since a trial holds its cluster as a run does."`
	Clusters   []string         `json:"clusters" spec:"min=0,max=16,kind=dns1035" doc:"The RayClusters trials may use (each as cluster.name, the rest of cluster as given); empty: cluster.name alone."`
	Budget     SweepBudget      `json:"budget" doc:"When no new trial starts: the trials that ran used this much. Trials already running go on."`
	// EarlyStopping stops a trial whose held-out loss trails the others'.
	EarlyStopping EarlyStopping `json:"earlyStopping" doc:"Stopping trials early on the held-out loss (needs dataset.evalShare or dataset.evalSplit)."`
}

// SweepParameter is one field a sweep varies and the values it tries.
type SweepParameter struct {
	Path    string    `json:"path" spec:"kind=sweeppath" doc:"The spec path of the field: a numeric, enumerated or true/false field of training, lora or dataset (not the held-out rows, the split, the format, the data check or the worker count, which make trials incomparable or change the cluster)."`
	Values  []float64 `json:"values" spec:"min=0,max=32" doc:"The numbers to try, for a numeric field (whole numbers for a whole-number field)."`
	Choices []string  `json:"choices" spec:"min=0,max=32,kind=token" doc:"The values to try, for an enumerated field (one of its values) or a true/false field (true, false)."`
	Min     float64   `json:"min" doc:"The range's low end, for random search over a numeric field."`
	Max     float64   `json:"max" doc:"The range's high end (above min)."`
	Scale   string    `json:"scale" spec:"optional,enum=linear|log" doc:"How a range is drawn: linear (uniformly, the default) or log (log-uniformly; min above 0). A whole-number field's draw is rounded."`
}

// SweepBudget bounds what a sweep's trials may use before no new one
// starts.
type SweepBudget struct {
	GPUHours float64 `json:"gpuHours" spec:"min=0,max=1000000" doc:"GPU-hours of the trials that ran; 0: no bound."`
	CostUSD  float64 `json:"costUsd" spec:"min=0,max=100000000" doc:"Estimated cost of the trials that ran, in US dollars; 0: no bound."`
}

// EarlyStopping is the rule that stops trials early.
type EarlyStopping struct {
	Rule      string `json:"rule" spec:"enum=none|median" doc:"none: every trial runs to its end; median: after a trial's checkpoint k, if its held-out loss is worse than the median of the other trials' losses at their checkpoint k, it is stopped (its RayJob deleted, its checkpoints kept) and ends STOPPED, reason EarlyStopped."`
	MinTrials int    `json:"minTrials" spec:"min=1,max=99" doc:"The median rule compares a trial with at least this many other trials that reported checkpoint k."`
}

// The sweep's bounds.
const (
	// MaxTrials is the most trials a sweep may have.
	MaxTrials = 100
	// Search kinds.
	SearchGrid   = "grid"
	SearchRandom = "random"
	// Early stopping rules.
	StopNone   = "none"
	StopMedian = "median"
)

// IsZero reports whether the spec asks for no sweep: a sweep needs a
// parameter. (It keeps a spec without one the same JSON, and so the same
// hash, as before sweeps existed.)
func (w Sweep) IsZero() bool { return len(w.Parameters) == 0 }

// Swept reports whether the spec is a sweep.
func (s *JobSpec) Swept() bool { return !s.Sweep.IsZero() }

// SweepClusters are the clusters the sweep's trials use, in order.
func (s *JobSpec) SweepClusters() []string {
	if len(s.Sweep.Clusters) > 0 {
		return s.Sweep.Clusters
	}
	return []string{s.Cluster.Name}
}

// SweepParallel is how many of the sweep's trials run at once.
func (s *JobSpec) SweepParallel() int {
	n := len(s.SweepClusters())
	if p := s.Sweep.Parallel; p > 0 && p < n {
		return p
	}
	return n
}

// sweepField is a field a sweep may vary.
type sweepField struct {
	typ  reflect.Type
	enum []string // for a string field; nil for numbers and booleans
	r    rules
}

// notSwept are fields of the swept sections a sweep may not vary: the
// held-out rows, the split and the format (trials would be ranked on
// different rows, or read the data differently),
// the data check (a step before the trial, not part of it), and the worker
// count (it changes the cluster's size).
var notSwept = []string{"dataset.evalShare", "dataset.evalSplit", "dataset.split", "dataset.format", "dataset.check", "training.workers"}

// sweepFields is every field a sweep may vary, by path: the numeric,
// enumerated and true/false fields of training, lora and dataset, read
// from the types' tags, so a new field is sweepable without a list to keep.
var sweepFields = func() map[string]sweepField {
	out := map[string]sweepField{}
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		for _, f := range fieldsOf(t).list {
			p := joinPath(path, f.name)
			switch {
			case slices.Contains(notSwept, p):
			case f.typ.Kind() == reflect.Struct:
				walk(f.typ, p)
			case f.typ.Kind() == reflect.Int, f.typ.Kind() == reflect.Float64, f.typ.Kind() == reflect.Bool:
				out[p] = sweepField{typ: f.typ, r: f.rules}
			case f.typ.Kind() == reflect.String && len(f.rules.enum) > 0:
				out[p] = sweepField{typ: f.typ, enum: f.rules.enum, r: f.rules}
			}
		}
	}
	root := fieldsOf(reflect.TypeOf(JobSpec{}))
	for _, section := range []string{"training", "lora", "dataset"} {
		walk(root.byName[section].typ, section)
	}
	return out
}()

// SweepPaths lists the fields a sweep may vary, sorted.
func SweepPaths() []string {
	out := make([]string, 0, len(sweepFields))
	for p := range sweepFields {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

func init() {
	paths := SweepPaths()
	quoted := make([]string, len(paths))
	for i, p := range paths {
		quoted[i] = regexp.QuoteMeta(p)
	}
	kinds["sweeppath"] = stringKind{
		check: func(s string) string {
			if _, ok := sweepFields[s]; ok {
				return ""
			}
			return "is not a field a sweep may vary"
		},
		allowed: "one of " + strings.Join(paths, ", "),
		pattern: "^(?:" + strings.Join(quoted, "|") + ")$",
	}
}

// ParamValue is one parameter's value in a trial.
type ParamValue struct {
	Path  string `json:"path"`
	Value any    `json:"value"` // float64, int, string or bool, as the field's type
}

// String shows the value as a spec would write it: path=value.
func (p ParamValue) String() string {
	b, _ := json.Marshal(p.Value)
	return p.Path + "=" + strings.Trim(string(b), `"`)
}

// Trial is one run of a sweep: its 1-based index, its parameters' values
// and the spec it runs (the sweep's spec with those values, on its
// cluster, without the sweep).
type Trial struct {
	Index  int          `json:"index"`
	Params []ParamValue `json:"params"`
	Spec   *JobSpec     `json:"-"`
}

// TrialSpec is the spec trial index of a sweep runs, on cluster, with
// params: the sweep's spec with the values set and the sweep and runId
// left out. It validates it as Parse does.
func (s *JobSpec) TrialSpec(params []ParamValue, cluster string) (*JobSpec, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	delete(m, "sweep")
	delete(m, "runId")
	setPath(m, "cluster.name", cluster)
	for _, p := range params {
		setPath(m, p.Path, p.Value)
	}
	b, _ = json.Marshal(m)
	return Parse(b)
}

func setPath(m map[string]any, path string, v any) {
	parts := strings.Split(path, ".")
	for _, k := range parts[:len(parts)-1] {
		next, ok := m[k].(map[string]any)
		if !ok {
			next = map[string]any{}
			m[k] = next
		}
		m = next
	}
	m[parts[len(parts)-1]] = v
}

// Trials expands the sweep into its trials' parameters: grid in the order
// of the parameters (the last varying fastest), random drawn with the
// sweep's seed. Each trial's Spec is left nil; TrialSpec makes it.
func (s *JobSpec) Trials() ([]Trial, error) {
	w := s.Sweep
	if w.IsZero() {
		return nil, nil
	}
	var out []Trial
	switch w.Search {
	case SearchGrid:
		n := 1
		for _, p := range w.Parameters {
			n *= max(len(p.Values)+len(p.Choices), 1)
			if n > MaxTrials {
				return nil, fmt.Errorf("the grid has more than %d trials", MaxTrials)
			}
		}
		for i := range n {
			t := Trial{Index: i + 1}
			rest := i
			params := make([]ParamValue, len(w.Parameters))
			for j := len(w.Parameters) - 1; j >= 0; j-- {
				p := w.Parameters[j]
				k := max(len(p.Values)+len(p.Choices), 1)
				params[j] = p.valueAt(rest % k)
				rest /= k
			}
			t.Params = params
			out = append(out, t)
		}
	case SearchRandom:
		rng := rand.New(rand.NewPCG(uint64(w.Seed), 0x5eed))
		for i := range w.Trials {
			t := Trial{Index: i + 1}
			for _, p := range w.Parameters {
				t.Params = append(t.Params, p.draw(rng))
			}
			out = append(out, t)
		}
	}
	return out, nil
}

// valueAt is the parameter's i-th value or choice, as its field's type.
func (p SweepParameter) valueAt(i int) ParamValue {
	if len(p.Choices) > 0 {
		return p.choice(p.Choices[i])
	}
	return p.number(p.Values[i])
}

// draw draws the parameter's value for a random trial.
func (p SweepParameter) draw(rng *rand.Rand) ParamValue {
	switch {
	case len(p.Choices) > 0:
		return p.choice(p.Choices[rng.IntN(len(p.Choices))])
	case len(p.Values) > 0:
		return p.number(p.Values[rng.IntN(len(p.Values))])
	case p.Scale == "log":
		lo, hi := math.Log(p.Min), math.Log(p.Max)
		return p.number(math.Exp(lo + rng.Float64()*(hi-lo)))
	default:
		return p.number(p.Min + rng.Float64()*(p.Max-p.Min))
	}
}

func (p SweepParameter) number(v float64) ParamValue {
	if f, ok := sweepFields[p.Path]; ok && f.typ.Kind() == reflect.Int {
		return ParamValue{Path: p.Path, Value: int(math.Round(v))}
	}
	// Draws keep six significant digits: a learning rate of 0.000123457,
	// not 0.00012345678901.
	r, _ := strconv.ParseFloat(strconv.FormatFloat(v, 'g', 6, 64), 64)
	return ParamValue{Path: p.Path, Value: r}
}

func (p SweepParameter) choice(c string) ParamValue {
	if f, ok := sweepFields[p.Path]; ok && f.typ.Kind() == reflect.Bool {
		return ParamValue{Path: p.Path, Value: c == "true"}
	}
	return ParamValue{Path: p.Path, Value: c}
}

// sweepChecks are the sweep's rules that join fields, and every trial's
// spec validated as a run's would be.
func (s *JobSpec) sweepChecks() Problems {
	w := s.Sweep
	if w.IsZero() {
		def := Defaults().Sweep
		if w.Search != def.Search || w.Trials != def.Trials || w.Seed != def.Seed || w.Parallel != def.Parallel ||
			len(w.Clusters) > 0 || w.Budget != def.Budget || w.EarlyStopping != def.EarlyStopping {
			return Problems{{Path: "sweep.parameters", Message: "has 0 items (a sweep needs at least one parameter; leave sweep out for one run)"}}
		}
		return nil
	}
	var ps Problems
	seen := map[string]bool{}
	for i, p := range w.Parameters {
		ps = append(ps, p.check(indexPath("sweep.parameters", i), w.Search)...)
		if seen[p.Path] && p.Path != "" {
			ps = append(ps, Problem{Path: indexPath("sweep.parameters", i) + ".path", Message: fmt.Sprintf("%s is varied twice (allowed: each field once)", quote(p.Path))})
		}
		seen[p.Path] = true
	}
	switch w.Search {
	case SearchGrid:
		if w.Trials != 0 {
			ps = append(ps, Problem{Path: "sweep.trials", Message: fmt.Sprintf("is %d with search grid, which runs every combination (allowed: 0 for grid; a count with random)", w.Trials)})
		}
		n := 1
		for _, p := range w.Parameters {
			n *= max(len(p.Values)+len(p.Choices), 1)
		}
		if n > MaxTrials {
			ps = append(ps, Problem{Path: "sweep.parameters", Message: fmt.Sprintf("make a grid of %d trials (allowed: at most %d; use search random with trials)", n, MaxTrials)})
		}
	case SearchRandom:
		if w.Trials < 1 {
			ps = append(ps, Problem{Path: "sweep.trials", Message: fmt.Sprintf("is %d with search random (allowed: 1 to %d)", w.Trials, MaxTrials)})
		}
	}
	clusters := s.SweepClusters()
	if w.Parallel > len(clusters) {
		ps = append(ps, Problem{Path: "sweep.parallel", Message: fmt.Sprintf("%d is more than the clusters trials may use, %d (allowed: at most %d: a trial holds its cluster; name more in sweep.clusters)", w.Parallel, len(clusters), len(clusters))})
	}
	for i, c := range w.Clusters {
		if slices.Index(w.Clusters, c) < i {
			ps = append(ps, Problem{Path: indexPath("sweep.clusters", i), Message: fmt.Sprintf("%s is listed twice (allowed: each cluster once)", quote(c))})
		}
	}
	if w.EarlyStopping.Rule == StopMedian && s.Dataset.EvalShare == 0 && s.Dataset.EvalSplit == "" {
		ps = append(ps, Problem{Path: "sweep.earlyStopping.rule", Message: "median needs a held-out loss, and dataset.evalShare is 0 with no dataset.evalSplit (allowed: none, or hold rows out)"})
	}
	if len(ps) > 0 {
		return ps
	}
	trials, err := s.Trials()
	if err != nil {
		return Problems{{Path: "sweep", Message: err.Error()}}
	}
	if w.EarlyStopping.Rule == StopMedian && w.EarlyStopping.MinTrials >= len(trials) {
		ps = append(ps, Problem{Path: "sweep.earlyStopping.minTrials", Message: fmt.Sprintf("%d needs at least %d trials, and the sweep has %d (allowed: at most %d, or rule none)", w.EarlyStopping.MinTrials, w.EarlyStopping.MinTrials+1, len(trials), len(trials)-1)})
	}
	// Every trial's spec must be valid; the first problems are named with
	// the trial that has them.
	const shown = 5
	bad := 0
	for _, t := range trials {
		_, err := s.TrialSpec(t.Params, clusters[0])
		var tps Problems
		if err == nil || !asProblems(err, &tps) {
			continue
		}
		for _, tp := range tps {
			if bad++; bad <= shown {
				ps = append(ps, Problem{Path: "sweep.parameters", Message: fmt.Sprintf("trial %d (%s) is not a valid spec: %s: %s", t.Index, paramsText(t.Params), tp.Path, tp.Message)})
			}
		}
	}
	if bad > shown {
		ps = append(ps, Problem{Path: "sweep.parameters", Message: fmt.Sprintf("and %d more problems of trials", bad-shown)})
	}
	return ps
}

func asProblems(err error, ps *Problems) bool { return errors.As(err, ps) }

func paramsText(params []ParamValue) string {
	out := make([]string, len(params))
	for i, p := range params {
		out[i] = p.String()
	}
	return strings.Join(out, ", ")
}

// check is one parameter's own rules: values for a number, choices for an
// enumerated or true/false field, a range only for random search.
func (p SweepParameter) check(path, search string) Problems {
	f, ok := sweepFields[p.Path]
	if !ok {
		return nil // the path's kind check says why
	}
	var ps Problems
	ranged := p.Min != 0 || p.Max != 0 || p.Scale != ""
	given := 0
	for _, g := range []bool{len(p.Values) > 0, len(p.Choices) > 0, ranged} {
		if g {
			given++
		}
	}
	numeric := f.typ.Kind() == reflect.Int || f.typ.Kind() == reflect.Float64
	switch {
	case given != 1 && numeric:
		ps = append(ps, Problem{Path: path, Message: fmt.Sprintf("%s is a number: give values, or min and max (one of them)", p.Path)})
	case given != 1 || !numeric && (len(p.Values) > 0 || ranged):
		ps = append(ps, Problem{Path: path + ".choices", Message: fmt.Sprintf("%s is %s: give choices (allowed: %s)", p.Path, fieldKind(f), strings.Join(fieldChoices(f), ", "))})
	case numeric && len(p.Choices) > 0:
		ps = append(ps, Problem{Path: path + ".choices", Message: fmt.Sprintf("%s is a number: give values, or min and max, not choices", p.Path)})
	case ranged:
		if search == SearchGrid {
			ps = append(ps, Problem{Path: path, Message: "a range needs search random (allowed with grid: values)"})
		}
		if p.Min >= p.Max {
			ps = append(ps, Problem{Path: path + ".max", Message: fmt.Sprintf("%s is not above min %s (allowed: max > min)", fnum(p.Max), fnum(p.Min))})
		}
		if p.Scale == "log" && p.Min <= 0 {
			ps = append(ps, Problem{Path: path + ".min", Message: fmt.Sprintf("%s with scale log (allowed: above 0)", fnum(p.Min))})
		}
		for _, end := range []struct {
			name string
			v    float64
		}{{"min", p.Min}, {"max", p.Max}} {
			if msg := checkNumber(end.v, fnum(end.v), f.r); msg != "" {
				ps = append(ps, Problem{Path: path + "." + end.name, Message: fmt.Sprintf("%s, as %s", msg, p.Path)})
			}
		}
	}
	for i, v := range p.Values {
		if f.typ.Kind() == reflect.Int && v != math.Trunc(v) {
			ps = append(ps, Problem{Path: indexPath(path+".values", i), Message: fmt.Sprintf("%s is not a whole number, and %s is one", fnum(v), p.Path)})
		}
		if slices.Index(p.Values, v) < i {
			ps = append(ps, Problem{Path: indexPath(path+".values", i), Message: fmt.Sprintf("%s is listed twice (allowed: each value once)", fnum(v))})
		}
	}
	for i, c := range p.Choices {
		if !numeric && !slices.Contains(fieldChoices(f), c) {
			ps = append(ps, Problem{Path: indexPath(path+".choices", i), Message: fmt.Sprintf("%s is not a value of %s (allowed: %s)", quote(c), p.Path, strings.Join(fieldChoices(f), ", "))})
		}
		if slices.Index(p.Choices, c) < i {
			ps = append(ps, Problem{Path: indexPath(path+".choices", i), Message: fmt.Sprintf("%s is listed twice (allowed: each choice once)", quote(c))})
		}
	}
	return ps
}

func fieldKind(f sweepField) string {
	if f.typ.Kind() == reflect.Bool {
		return "true or false"
	}
	return "enumerated"
}

func fieldChoices(f sweepField) []string {
	if f.typ.Kind() == reflect.Bool {
		return []string{"true", "false"}
	}
	return f.enum
}

func fnum(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
