// Package report renders a run's report: one self-contained HTML page
// that finalize writes beside the run's checkpoints (report.html) and
// `raydrop report` fetches or renders. It needs nothing from anywhere else
// (no script, font, style sheet or image is fetched: the charts are inline
// SVG, the sample images data: URLs), so it opens from a bucket's
// authenticated URL as well as from a laptop.
//
// It shows what exists, also for a run that failed or was cancelled: the
// training and evaluation loss, learning rate and gradient norm against the
// step for every attempt, the phase timeline with each attempt and what
// ended it, the checkpoints with the best marked, the sample answers beside
// their images, the GPU-hours and estimated cost, and where the spec
// differs from the defaults.
package report

import (
	"bytes"
	"encoding/json"
	"fmt"
	"html/template"
	"math"
	"sort"
	"strings"
	"time"

	_ "embed"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/spec"
)

// Input is everything the report shows.
type Input struct {
	Record *runs.Record
	// Event is the data of the run's event for its phase (the terminal
	// event's for a run that has ended): timings, checkpoints, cost.
	Event      events.Run
	Series     []Attempt
	Samples    *Samples
	Defaults   *spec.JobSpec // nil: no spec section
	GPUHourUSD float64
	Generated  time.Time
	// Unreadable names the objects the report could not read.
	Unreadable []string
	// Evidence is what finalize kept of the last attempt's pods before
	// the teardown (nil: none was kept, or the run is still going).
	Evidence *Evidence
}

// Evidence is an attempt's evidence folder and its manifest.
type Evidence struct {
	Folder   string // gs://…/evidence/attempt-<n>
	Manifest evidence.Manifest
	// RayLogs are the Ray pods' own log folders the raylogs sidecars
	// copied beside the manifest (ray/<pod>/), by pod name.
	RayLogs []RayLogs
}

// RayLogs is one Ray pod's copied log folder.
type RayLogs struct {
	Pod    string
	Folder string // gs://…/evidence/attempt-<n>/ray/<pod>
	Files  []string
}

// Attempt is the metrics of every report one attempt logged.
type Attempt struct {
	N     int
	Lines []map[string]float64
}

// Samples are the tuned and base model's answers to held-out rows.
type Samples struct {
	URI          string
	MaxNewTokens int
	Seconds      float64
	Samples      []Sample
	Left         int    // answers not shown
	Base, Tuned  *Score // nil for samples written before the scores existed
}

// Sample is one held-out row and the answers to it.
type Sample struct {
	Prompt, Reference, Base, Tuned string
	Images                         []SampleImage
}

// SampleImage is one image of a sample row.
type SampleImage struct {
	Name, URI string
	Data      template.URL // data: URL; "" when not inlined
	Note      string       // why the image is missing
}

// Score is how close a model's sample answers came to the references:
// the share answered exactly, and the mean word-overlap F1.
type Score struct {
	ExactMatch float64 `json:"exactMatch"`
	TokenF1    float64 `json:"tokenF1"`
}

// Charts: each plots these metrics against the step, one line per attempt.
var charts = []struct {
	Title   string
	Metrics []string
}{
	{"Loss (answer tokens): training, and held-out at each checkpoint", []string{"loss", "eval_loss"}},
	{"Learning rate", []string{"learning_rate"}},
	{"Gradient norm (before clipping)", []string{"grad_norm"}},
}

// Metrics are the metrics the charts plot, in order.
func Metrics() []string {
	var out []string
	for _, c := range charts {
		out = append(out, c.Metrics...)
	}
	return out
}

//go:embed report.html.tmpl
var pageText string

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"tier":    tierText,
	"startup": startupText,
	"when":    func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05 UTC") },
	"whenp": func(t *time.Time) string {
		if t == nil {
			return "–"
		}
		return t.UTC().Format("2006-01-02 15:04:05 UTC")
	},
	"kib": func(n int) string { return fmt.Sprintf("%.1f KiB", float64(n)/1024) },
	// inFolder: a cause's source is a file of the evidence folder (not,
	// say, the trainer's mark).
	"inFolder": func(source string) bool { return !strings.Contains(source, " ") },
	"kib64":    func(n int64) string { return fmt.Sprintf("%.1f KiB", float64(n)/1024) },
	"secs":     func(s float64) string { return (time.Duration(s * float64(time.Second))).Round(time.Second).String() },
	"num":      num,
	"usd":      func(f float64) string { return fmt.Sprintf("$%.2f", f) },
	"lower":    strings.ToLower,
	"metric":   func(m map[string]float64, k string) string { return numOr(m, k) },
}).Parse(pageText))

// tierText is the capacity tier an attempt was on ("spot, tier 2 of 3"),
// with the preemptions that ended it.
func tierText(r *runs.Record, a runs.Attempt) string {
	if r.Spec == nil {
		return "–"
	}
	tiers := r.Spec.Tiers()
	s := fmt.Sprintf("%s, tier %d of %d", r.Spec.Tier(a.Tier).Name(), a.Tier+1, len(tiers))
	if n := len(a.Preemptions); n > 0 {
		s += fmt.Sprintf("; preempted (%s)", strings.Join(a.Preemptions, "; "))
	}
	return s
}

// startupText is how an attempt's workers came up, "–" when the monitor
// did not see them all run.
func startupText(a runs.Attempt) string {
	if p, ok := a.StartupParts(); ok {
		return p.Text()
	}
	return "–"
}

// Render renders the report page.
func Render(in Input) ([]byte, error) {
	v := view{Input: in, Rec: in.Record, Phase: strings.ToLower(string(in.Record.Phase))}
	for _, c := range charts {
		v.Charts = append(v.Charts, plot(c.Title, c.Metrics, in.Series))
	}
	for _, a := range in.Series {
		v.Steps += len(a.Lines)
	}
	v.Timeline = timeline(in.Record, in.Generated)
	v.TimelineH = float64(len(v.Timeline)) * timelineRow
	if in.Defaults != nil && in.Record.Spec != nil {
		v.SpecDiff = diff(*in.Defaults, *in.Record.Spec)
	}
	if b := in.Event.BestCheckpoint; b != nil {
		v.BestURI = b.URI
	}
	v.Logs = map[int]string{}
	for _, a := range in.Record.Attempts {
		if in.Record.Spec != nil {
			b, exp := manifests.Experiment(in.Record.Spec, in.Record.RunID, a.N)
			v.Logs[a.N] = "gs://" + b + "/" + exp + "/" + checkpoints.DriverLogFile
		}
	}
	var buf bytes.Buffer
	if err := page.Execute(&buf, v); err != nil {
		return nil, fmt.Errorf("render report of run %s: %w", in.Record.RunID, err)
	}
	return buf.Bytes(), nil
}

type view struct {
	Input
	Rec      *runs.Record
	Phase    string
	Charts   []chart
	Steps    int
	Timeline []segment
	// TimelineH is the timeline's height.
	TimelineH float64
	SpecDiff  []change
	BestURI   string
	// Logs are the attempts' driver logs, by attempt.
	Logs map[int]string
}

// Chart geometry, in SVG user units.
const (
	chartW, chartH                 = 720.0, 240.0
	padL, padR, padT, padB         = 64.0, 16.0, 12.0, 32.0
	plotW, plotH                   = chartW - padL - padR, chartH - padT - padB
	ticks                          = 4
	timelineW, timelineRow, labelW = 720.0, 22.0, 120.0
)

type chart struct {
	Title          string
	W, H           float64
	Series         []series
	XTicks, YTicks []tick
	Points         int
}

type series struct {
	Metric  string
	Attempt int
	Path    string
	Points  []point
}

type point struct {
	X, Y        float64
	Step, Value string
}

type tick struct {
	Pos   float64
	Label string
}

// plot lays out one chart: a polyline and a dot per logged report of each
// attempt that has the metric.
func plot(title string, metrics []string, attempts []Attempt) chart {
	c := chart{Title: title, W: chartW, H: chartH}
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, a := range attempts {
		for _, l := range a.Lines {
			for _, m := range metrics {
				if v, ok := l[m]; ok {
					s := l["step"]
					minX, maxX = math.Min(minX, s), math.Max(maxX, s)
					minY, maxY = math.Min(minY, v), math.Max(maxY, v)
				}
			}
		}
	}
	if math.IsInf(minX, 1) {
		return c
	}
	if maxX == minX {
		maxX = minX + 1
	}
	if maxY == minY {
		pad := math.Max(math.Abs(minY)*0.1, 1e-9)
		minY, maxY = minY-pad, maxY+pad
	}
	x := func(s float64) float64 { return padL + (s-minX)/(maxX-minX)*plotW }
	y := func(v float64) float64 { return padT + (maxY-v)/(maxY-minY)*plotH }
	for i := 0; i <= ticks; i++ {
		f := float64(i) / ticks
		c.XTicks = append(c.XTicks, tick{Pos: x(minX + f*(maxX-minX)), Label: num(math.Round(minX + f*(maxX-minX)))})
		c.YTicks = append(c.YTicks, tick{Pos: y(minY + f*(maxY-minY)), Label: num(minY + f*(maxY-minY))})
	}
	for _, m := range metrics {
		for _, a := range attempts {
			s := series{Metric: m, Attempt: a.N}
			var d strings.Builder
			for _, l := range a.Lines {
				v, ok := l[m]
				if !ok {
					continue
				}
				p := point{X: x(l["step"]), Y: y(v), Step: num(l["step"]), Value: num(v)}
				if d.Len() == 0 {
					d.WriteString("M")
				} else {
					d.WriteString(" L")
				}
				fmt.Fprintf(&d, "%.1f %.1f", p.X, p.Y)
				s.Points = append(s.Points, p)
			}
			if len(s.Points) > 0 {
				s.Path = d.String()
				c.Series = append(c.Series, s)
				c.Points += len(s.Points)
			}
		}
	}
	return c
}

// segment is one stay in a phase, on the timeline.
type segment struct {
	Phase, Class string
	Start, End   time.Time
	Seconds      float64
	X, W, Y      float64
	Attempt      int
}

// timeline lays out every entry of the record's history: from one entry
// to the next, the last up to the run's end (or now).
func timeline(r *runs.Record, now time.Time) []segment {
	h := r.History
	if len(h) == 0 {
		return nil
	}
	end := now
	if r.Phase.Terminal() {
		end = h[len(h)-1].At
	}
	start := h[0].At
	total := end.Sub(start).Seconds()
	if total <= 0 {
		total = 1
	}
	var out []segment
	for i, e := range h {
		stop := end
		if i+1 < len(h) {
			stop = h[i+1].At
		}
		s := segment{Phase: string(e.Phase), Class: strings.ToLower(string(e.Phase)), Start: e.At, End: stop, Seconds: stop.Sub(e.At).Seconds(), Attempt: e.Attempt}
		s.X = labelW + e.At.Sub(start).Seconds()/total*(timelineW-labelW)
		s.W = math.Max(stop.Sub(e.At).Seconds()/total*(timelineW-labelW), 2)
		s.Y = float64(i) * timelineRow
		out = append(out, s)
	}
	return out
}

// change is one spec field that differs from the default.
type change struct{ Path, Default, Value string }

// diff lists the fields of s that differ from the defaults d, by JSON path.
func diff(d, s spec.JobSpec) []change {
	a, b := flatten(d), flatten(s)
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	delete(keys, "$schema") // where the editor found the schema, not a setting
	var out []change
	for k := range keys {
		if a[k] != b[k] {
			def := a[k]
			if def == "" || def == `""` {
				def = "(no default)"
			}
			out = append(out, change{Path: k, Default: def, Value: orDash(b[k])})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out
}

func orDash(s string) string {
	if s == "" {
		return "(unset)"
	}
	return s
}

// flatten maps every leaf of v's JSON form to its value, by dotted path.
func flatten(v any) map[string]string {
	b, _ := json.Marshal(v)
	var tree any
	_ = json.Unmarshal(b, &tree)
	out := map[string]string{}
	var walk func(prefix string, t any)
	walk = func(prefix string, t any) {
		if m, ok := t.(map[string]any); ok {
			for k, c := range m {
				walk(strings.TrimPrefix(prefix+"."+k, "."), c)
			}
			return
		}
		if t == nil {
			return
		}
		leaf, _ := json.Marshal(t)
		out[prefix] = string(leaf)
	}
	walk("", tree)
	return out
}

// num prints a number briefly: integers whole, others to four significant
// digits.
func num(f float64) string {
	if f == math.Trunc(f) && math.Abs(f) < 1e15 {
		return fmt.Sprintf("%.0f", f)
	}
	return fmt.Sprintf("%.4g", f)
}

func numOr(m map[string]float64, k string) string {
	if v, ok := m[k]; ok {
		return num(v)
	}
	return "–"
}
