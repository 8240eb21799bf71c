package report

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"math"
	"slices"
	"strings"

	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// SweepObject is where a sweep's report lives: beside its trials' folders,
// <output.bucket>/<prefix>/<sweep ID>/report.html.
func SweepObject(sw *sweeps.Record) (bucket, name string) {
	p := strings.TrimPrefix(manifests.StoragePath(sw.Spec, sw.SweepID), "gs://")
	bucket, prefix, _ := strings.Cut(p, "/")
	return bucket, prefix + "/" + File
}

// SweepURI is the sweep report's gs:// address.
func SweepURI(sw *sweeps.Record) string {
	b, n := SweepObject(sw)
	return "gs://" + b + "/" + n
}

//go:embed sweep.html.tmpl
var sweepTemplate string

var sweepPage = template.Must(template.New("sweep").Funcs(template.FuncMap{"num": num}).Parse(sweepTemplate))

// sweepRow is a trial in the sweep report's ranking.
type sweepRow struct {
	Rank   int
	T      events.SweepTrial
	Params string
	Class  string // its colour in the chart
	Best   bool
	Report string
	Loss   string
}

// RenderSweep renders a sweep's report: its trials ranked by held-out
// loss (those without one after, in order), and their held-out loss
// against the step overlaid in one chart, a stopped trial's line dashed.
// Like a run's report it is self-contained.
func RenderSweep(sw *sweeps.Record) ([]byte, error) {
	data := events.SweepData(sw)
	rows := make([]sweepRow, 0, len(data.Trials))
	for _, t := range data.Trials {
		var ps []string
		for _, p := range t.Params {
			ps = append(ps, p.String())
		}
		r := sweepRow{T: t, Params: strings.Join(ps, ", "), Class: fmt.Sprintf("c%d", (t.Index-1)%8), Best: t.Index == sw.Best, Loss: "–"}
		if t.BestEvalLoss != nil {
			r.Loss = num(*t.BestEvalLoss)
		}
		if t.Outcome != events.NotStarted {
			r.Report = "gs://" + strings.TrimPrefix(manifests.StoragePath(sw.Spec, t.RunID), "gs://") + "/" + File
		}
		rows = append(rows, r)
	}
	slices.SortStableFunc(rows, func(a, b sweepRow) int {
		switch {
		case a.T.BestEvalLoss != nil && b.T.BestEvalLoss != nil:
			return cmpFloat(*a.T.BestEvalLoss, *b.T.BestEvalLoss)
		case a.T.BestEvalLoss != nil:
			return -1
		case b.T.BestEvalLoss != nil:
			return 1
		}
		return a.T.Index - b.T.Index
	})
	for i := range rows {
		rows[i].Rank = i + 1
	}
	var buf bytes.Buffer
	err := sweepPage.Execute(&buf, struct {
		Sweep *sweeps.Record
		Data  events.Sweep
		Rows  []sweepRow
		Chart sweepChart
	}{sw, data, rows, sweepPlot(sw)})
	if err != nil {
		return nil, fmt.Errorf("render the report of sweep %s: %w", sw.SweepID, err)
	}
	return buf.Bytes(), nil
}

func cmpFloat(a, b float64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// sweepChart is the held-out loss of every trial against the step.
type sweepChart struct {
	W, H           float64
	XTicks, YTicks []tick
	Lines          []sweepLine
}

type sweepLine struct {
	Trial   int
	Class   string
	Stopped bool
	Path    string
	Points  []point
}

func sweepPlot(sw *sweeps.Record) sweepChart {
	c := sweepChart{W: chartW, H: chartH}
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, t := range sw.Trials {
		for i, l := range t.EvalLosses {
			s := float64(t.EvalSteps[i])
			minX, maxX = math.Min(minX, s), math.Max(maxX, s)
			minY, maxY = math.Min(minY, l), math.Max(maxY, l)
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
	for _, t := range sw.Trials {
		if len(t.EvalLosses) == 0 {
			continue
		}
		l := sweepLine{Trial: t.Index, Class: fmt.Sprintf("c%d", (t.Index-1)%8), Stopped: t.Ended == "STOPPED"}
		var d strings.Builder
		for i, v := range t.EvalLosses {
			p := point{X: x(float64(t.EvalSteps[i])), Y: y(v), Step: fmt.Sprint(t.EvalSteps[i]), Value: num(v)}
			if d.Len() == 0 {
				d.WriteString("M")
			} else {
				d.WriteString(" L")
			}
			fmt.Fprintf(&d, "%.1f %.1f", p.X, p.Y)
			l.Points = append(l.Points, p)
		}
		l.Path = d.String()
		c.Lines = append(c.Lines, l)
	}
	return c
}
