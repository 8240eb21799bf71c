package spec

import (
	"cmp"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

const rootPath = "$"

// Problem is one thing wrong with a spec: where, and what is wrong and allowed.
type Problem struct {
	Path    string `json:"path"`
	Message string `json:"message"`
}

func (p Problem) String() string { return p.Path + ": " + p.Message }

// Problems is every problem found in a spec. It is the error Parse and
// Validate return for bad input; no redelivery can fix it.
type Problems []Problem

func (ps Problems) Error() string {
	lines := make([]string, len(ps))
	for i, p := range ps {
		lines[i] = p.String()
	}
	return "invalid job spec: " + strings.Join(lines, "; ")
}

func joinPath(path, key string) string {
	if path == "" || path == rootPath {
		return key
	}
	return path + "." + key
}

func displayPath(path string) string {
	if path == "" {
		return rootPath
	}
	return path
}

// Duration is a time.Duration written as a Go duration string ("90m", "24h").
type Duration time.Duration

const (
	minute = time.Minute
	hour   = time.Hour
)

var durationType = reflect.TypeOf(Duration(0))

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) {
	return json.Marshal(time.Duration(d).String())
}

// UnmarshalJSON reads a duration string.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		v = -1 // an invalid marker: Validate reports it with its path
	}
	*d = Duration(v)
	return nil
}

// rules are the parsed `spec` tag of a field.
type rules struct {
	required bool
	optional bool // an empty string is allowed (and skips the kind check)
	kind     string
	enum     []string
	min, max string
	gt       string
}

func parseRules(tag string) rules {
	var r rules
	for _, part := range strings.Split(tag, ",") {
		k, v, _ := strings.Cut(part, "=")
		switch k {
		case "":
		case "required":
			r.required = true
		case "optional":
			r.optional = true
		case "kind":
			r.kind = v
		case "enum":
			r.enum = strings.Split(v, "|")
		case "min":
			r.min = v
		case "max":
			r.max = v
		case "gt":
			r.gt = v
		default:
			panic("spec: unknown rule " + k)
		}
	}
	return r
}

type field struct {
	name  string
	index int
	typ   reflect.Type
	rules rules
	doc   string
}

type fieldSet struct {
	list   []field
	byName map[string]field
	names  []string
}

var fieldCache sync.Map // reflect.Type → fieldSet

func fieldsOf(t reflect.Type) fieldSet {
	if v, ok := fieldCache.Load(t); ok {
		return v.(fieldSet)
	}
	fs := fieldSet{byName: map[string]field{}}
	for i := 0; i < t.NumField(); i++ {
		sf := t.Field(i)
		name, _, _ := strings.Cut(sf.Tag.Get("json"), ",")
		f := field{name: name, index: i, typ: sf.Type, rules: parseRules(sf.Tag.Get("spec")), doc: sf.Tag.Get("doc")}
		fs.list = append(fs.list, f)
		fs.byName[name] = f
		fs.names = append(fs.names, name)
	}
	fieldCache.Store(t, fs)
	return fs
}

// Validate checks every field of s against its rules and the rules that
// join fields, and returns Problems listing all that fail.
func (s *JobSpec) Validate() error {
	var ps Problems
	validateStruct(reflect.ValueOf(s).Elem(), "", &ps)
	ps = append(ps, s.crossChecks()...)
	ps = append(ps, findSecrets(reflect.ValueOf(s).Elem(), "")...)
	if len(ps) > 0 {
		return ps
	}
	return nil
}

func validateStruct(v reflect.Value, path string, ps *Problems) {
	for _, f := range fieldsOf(v.Type()).list {
		fv := v.Field(f.index)
		p := joinPath(path, f.name)
		if f.typ.Kind() == reflect.Struct {
			validateStruct(fv, p, ps)
			continue
		}
		if f.typ.Kind() == reflect.Slice {
			if msg := checkCount(fv.Len(), f.rules); msg != "" {
				*ps = append(*ps, Problem{Path: p, Message: msg})
			}
			for i := 0; i < fv.Len(); i++ {
				if f.typ.Elem().Kind() == reflect.String {
					// A list of strings: the count rules are the list's, the kind each item's.
					if msg := checkString(fv.Index(i).String(), rules{kind: f.rules.kind}); msg != "" {
						*ps = append(*ps, Problem{Path: indexPath(p, i), Message: msg})
					}
					continue
				}
				if f.typ.Elem().Kind() == reflect.Float64 {
					continue // a list of numbers: its count rules only
				}
				validateStruct(fv.Index(i), indexPath(p, i), ps)
			}
			continue
		}
		if msg := checkValue(fv, f.rules); msg != "" {
			*ps = append(*ps, Problem{Path: p, Message: msg})
		}
	}
}

// indexPath is the path of a list's item: cluster.capacity[0].
func indexPath(path string, i int) string { return path + "[" + strconv.Itoa(i) + "]" }

// checkCount checks a list's length against its min and max rules.
func checkCount(n int, r rules) string {
	lo, _ := strconv.Atoi(r.min)
	hi, _ := strconv.Atoi(r.max)
	if n < lo || (r.max != "" && n > hi) {
		return fmt.Sprintf("has %d items (allowed: from %s to %s)", n, r.min, r.max)
	}
	return ""
}

func checkValue(v reflect.Value, r rules) string {
	if v.Type() == durationType {
		return checkDuration(time.Duration(v.Int()), r)
	}
	switch v.Kind() {
	case reflect.String:
		return checkString(v.String(), r)
	case reflect.Int:
		return checkNumber(float64(v.Int()), strconv.FormatInt(v.Int(), 10), r)
	case reflect.Float64:
		return checkNumber(v.Float(), strconv.FormatFloat(v.Float(), 'g', -1, 64), r)
	}
	return ""
}

func checkString(s string, r rules) string {
	if s == "" {
		switch {
		case r.required:
			return "is required" + allowedSuffix(r)
		case r.optional:
			return ""
		default:
			return "must not be empty" + allowedSuffix(r)
		}
	}
	if r.max != "" {
		if n, _ := strconv.Atoi(r.max); len(s) > n {
			return fmt.Sprintf("is %d characters long (at most %d)", len(s), n)
		}
	}
	if len(r.enum) > 0 {
		for _, e := range r.enum {
			if s == e {
				return ""
			}
		}
		return fmt.Sprintf("%s is not allowed (allowed: %s)", quote(s), strings.Join(r.enum, ", "))
	}
	if r.kind != "" {
		k, ok := kinds[r.kind]
		if !ok {
			panic("spec: unknown kind " + r.kind)
		}
		if msg := k.check(s); msg != "" {
			return fmt.Sprintf("%s %s (%s)", quote(s), msg, k.allowed)
		}
	}
	return ""
}

func allowedSuffix(r rules) string {
	if len(r.enum) > 0 {
		return " (allowed: " + strings.Join(r.enum, ", ") + ")"
	}
	if k, ok := kinds[r.kind]; ok {
		return " (" + k.allowed + ")"
	}
	return ""
}

func checkNumber(x float64, text string, r rules) string {
	lo, hi := r.min, r.max
	rangeText := func() string {
		switch {
		case r.gt != "" && hi != "":
			return fmt.Sprintf("greater than %s and at most %s", r.gt, hi)
		case lo != "" && hi != "":
			return fmt.Sprintf("from %s to %s", lo, hi)
		case lo != "":
			return "at least " + lo
		case hi != "":
			return "at most " + hi
		}
		return ""
	}
	if r.gt != "" {
		if g, _ := strconv.ParseFloat(r.gt, 64); x <= g {
			return fmt.Sprintf("%s is out of range (allowed: %s)", text, rangeText())
		}
	}
	if lo != "" {
		if m, _ := strconv.ParseFloat(lo, 64); x < m {
			return fmt.Sprintf("%s is out of range (allowed: %s)", text, rangeText())
		}
	}
	if hi != "" {
		if m, _ := strconv.ParseFloat(hi, 64); x > m {
			return fmt.Sprintf("%s is out of range (allowed: %s)", text, rangeText())
		}
	}
	return ""
}

func checkDuration(d time.Duration, r rules) string {
	const allowed = "a duration such as 30m or 24h"
	if d < 0 {
		return "is not a duration (" + allowed + ")"
	}
	lo, _ := time.ParseDuration(r.min)
	hi, _ := time.ParseDuration(r.max)
	if d < lo || d > hi {
		return fmt.Sprintf("%s is out of range (allowed: from %s to %s)", d, r.min, r.max)
	}
	return ""
}

func quote(s string) string {
	if len(s) > 80 {
		s = s[:80] + "…"
	}
	return strconv.Quote(s)
}

// crossChecks are the rules that join several fields.
func (s *JobSpec) crossChecks() Problems {
	var ps Problems
	w := s.Cluster.Workers
	if w.MinReplicas > w.Replicas {
		ps = append(ps, Problem{Path: "cluster.workers.minReplicas", Message: fmt.Sprintf("%d is more than replicas %d (allowed: at most replicas)", w.MinReplicas, w.Replicas)})
	}
	if w.Replicas > w.MaxReplicas {
		ps = append(ps, Problem{Path: "cluster.workers.replicas", Message: fmt.Sprintf("%d is more than maxReplicas %d (allowed: at most maxReplicas)", w.Replicas, w.MaxReplicas)})
	}
	if capacity := w.Replicas * w.GPUs; s.Training.Workers > capacity {
		ps = append(ps, Problem{Path: "training.workers", Message: fmt.Sprintf("%d workers need %d GPUs but the cluster has %d (replicas %d × gpus %d) (allowed: at most %d)", s.Training.Workers, s.Training.Workers, capacity, w.Replicas, w.GPUs, capacity)})
	}
	if s.Limits.StartDeadline > s.Limits.Deadline && s.Limits.Deadline > 0 {
		ps = append(ps, Problem{Path: "limits.startDeadline", Message: fmt.Sprintf("%s is longer than deadline %s (allowed: at most the deadline)", time.Duration(s.Limits.StartDeadline), time.Duration(s.Limits.Deadline))})
	}
	ps = append(ps, s.datasetChecks()...)
	ps = append(ps, s.storageChecks()...)
	ps = append(ps, s.sweepChecks()...)
	return append(ps, s.capacityChecks()...)
}

// datasetChecks are the dataset's rules that join fields; the data itself is
// checked by the trainer's data check before any GPU is asked for.
func (s *JobSpec) datasetChecks() Problems {
	var ps Problems
	d := s.Dataset
	if d.Source != "" && d.Revision != "" {
		ps = append(ps, Problem{Path: "dataset.revision", Message: fmt.Sprintf("%s is set with dataset.source, which has no revisions (allowed: a revision only with a Hub dataset id; empty with source)", quote(d.Revision))})
	}
	if d.Format == FormatTemplate {
		names, _ := Placeholders(d.Template.Prompt)
		if len(names) == 0 && len(d.Template.Images) == 0 {
			ps = append(ps, Problem{Path: "dataset.template.prompt", Message: "names no column and dataset.template.images is empty, so every row would get the same prompt (allowed: at least one {column} placeholder or one image column)"})
		}
		if slices.Contains(d.Template.Images, d.Template.Answer) {
			ps = append(ps, Problem{Path: "dataset.template.answer", Message: fmt.Sprintf("%s is also an image column (allowed: a text column that is not in dataset.template.images)", quote(d.Template.Answer))})
		}
		if slices.Contains(names, d.Template.Answer) {
			ps = append(ps, Problem{Path: "dataset.template.prompt", Message: fmt.Sprintf("shows the answer column {%s} in the prompt (allowed: placeholders of other columns; the model would learn to copy its answer)", d.Template.Answer)})
		}
	}
	if d.Format == FormatMessages && d.Messages.Column == d.Messages.ImagesColumn {
		ps = append(ps, Problem{Path: "dataset.messages.imagesColumn", Message: fmt.Sprintf("%s is also dataset.messages.column (allowed: another column)", quote(d.Messages.ImagesColumn))})
	}
	return ps
}

// noOnDemand are the accelerators Compute Engine offers no on-demand VMs
// of: A4's B200s come from a reservation, flex-start or Spot VMs only.
var noOnDemand = map[string]bool{"nvidia-b200": true}

// tierTypesBut lists the capacity tier types other than typ, for a message.
func tierTypesBut(typ string) string {
	return strings.Join(slices.DeleteFunc(slices.Clone(TierTypes), func(t string) bool { return t == typ }), ", ")
}

// noFlexStart are the accelerators of the machine types flex-start does
// not serve: A4X (GB200) and G4 (RTX PRO 6000).
var noFlexStart = map[string]bool{"nvidia-gb200": true, "nvidia-rtx-pro-6000": true}

// capacityChecks are the rules of cluster.capacity: what GKE allows in a
// tier, and an order in which every tier gets its turn.
func (s *JobSpec) capacityChecks() Problems {
	var ps Problems
	tiers := s.Cluster.Capacity
	seen := map[string]int{}
	var waits time.Duration
	for i, t := range tiers {
		p := indexPath("cluster.capacity", i)
		switch {
		case t.Type == TierReservation && t.Reservation == "" && s.Cluster.Reservation == "":
			ps = append(ps, Problem{Path: "cluster.reservation", Message: fmt.Sprintf("is required: %s is a reservation tier that names no reservation (allowed: a reservation name, or one in the tier)", p)})
		case t.Type != TierReservation && t.Reservation != "":
			// Only a reservation tier consumes a reservation: flex-start
			// and Spot VMs never do
			// (https://cloud.google.com/kubernetes-engine/docs/concepts/consumption-options).
			ps = append(ps, Problem{Path: p + ".reservation", Message: fmt.Sprintf("%s names a reservation but the tier is %s (allowed: empty; a reservation is a tier of type reservation)", quote(t.Reservation), t.Type)})
		}
		if t.Type != TierReservation && t.Project != "" {
			// The reservation-project node selector goes with a specific
			// reservation only
			// (https://cloud.google.com/kubernetes-engine/docs/how-to/consuming-reservations).
			ps = append(ps, Problem{Path: p + ".project", Message: fmt.Sprintf("%s names a reservation's project but the tier is %s (allowed: empty; a project belongs to a reservation tier)", quote(t.Project), t.Type)})
		}
		if t.Type == TierOnDemand && noOnDemand[s.Cluster.Workers.Accelerator] {
			// "When provisioning A4 machine types, you must reserve capacity
			// to create instances or clusters, use Spot VMs, use Flex-start
			// VMs, or create a resize request in a MIG."
			// (https://cloud.google.com/compute/docs/accelerator-optimized-machines)
			ps = append(ps, Problem{Path: p + ".type", Message: fmt.Sprintf("onDemand is not offered for %s GPUs (allowed: %s)", s.Cluster.Workers.Accelerator, tierTypesBut(TierOnDemand))})
		}
		if t.Type == TierFlexStart && noFlexStart[s.Cluster.Workers.Accelerator] {
			// "Flex-start VMs support all accelerator-optimized machine
			// types (except A4X and G4)"
			// (https://cloud.google.com/compute/docs/instances/about-flex-start-vms)
			ps = append(ps, Problem{Path: p + ".type", Message: fmt.Sprintf("flexStart is not offered for %s GPUs (allowed: %s)", s.Cluster.Workers.Accelerator, tierTypesBut(TierFlexStart))})
		}
		key := t.Type
		if t.Type == TierReservation {
			key += " " + cmp.Or(t.Reservation, s.Cluster.Reservation)
			if t.Project != "" {
				key += " of project " + t.Project
			}
		}
		if j, dup := seen[key]; dup {
			ps = append(ps, Problem{Path: p, Message: fmt.Sprintf("repeats cluster.capacity[%d] (%s) (allowed: each tier once)", j, key)})
		}
		seen[key] = i
		last := i == len(tiers)-1
		switch w := time.Duration(t.Wait); {
		case !last && w < time.Minute:
			ps = append(ps, Problem{Path: p + ".wait", Message: fmt.Sprintf("%s is too short for a tier with another after it (allowed: from 1m to 24h)", w)})
		case last && w != 0:
			ps = append(ps, Problem{Path: p + ".wait", Message: fmt.Sprintf("%s is set on the last tier, which waits until limits.startDeadline (allowed: 0)", w)})
		default:
			waits += w
		}
	}
	if n := len(tiers); n > 1 && waits >= time.Duration(s.Limits.StartDeadline) {
		ps = append(ps, Problem{Path: "limits.startDeadline", Message: fmt.Sprintf("%s leaves the last capacity tier no time: the tiers before it wait %s in all (allowed: more than %s)", time.Duration(s.Limits.StartDeadline), waits, waits)})
	}
	return ps
}
