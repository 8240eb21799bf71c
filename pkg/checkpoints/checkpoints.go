// Package checkpoints finds the checkpoints and metrics of a training
// attempt from what Ray Train (V1 layout, Ray 2.48's default) wrote under its
// storage path:
//
//	<experiment>/TorchTrainer_<5hex>_00000_0_<date>/result.json   one JSON line per report
//	<experiment>/TorchTrainer_…/checkpoint_00000N/checkpoint/…     adapter, optimizer, trainer state
//	<experiment>/raydrop_result.json                               the trainer's completion mark
//
// It reads through a small Store interface, so the same code runs over a
// Cloud Storage bucket and over a local folder.
package checkpoints

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"path"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Store lists and reads objects by slash-separated name.
type Store interface {
	// List returns the names of every object whose name starts with prefix.
	List(ctx context.Context, prefix string) ([]string, error)
	// Read returns an object's content, failing if it is larger than limit.
	Read(ctx context.Context, name string, limit int64) ([]byte, error)
	// URI is the address of a name for people and downstream systems.
	URI(name string) string
}

// ErrNotFound is returned by Store.Read for a missing object.
var ErrNotFound = errors.New("object not found")

// ErrUnreadable marks an object no retry will read: one that is malformed,
// too large, or that the caller may not read. A Store's Read wraps it for
// the errors it knows to be permanent.
var ErrUnreadable = errors.New("unreadable")

// Files every usable checkpoint holds.
var AdapterFiles = []string{"adapter_model.safetensors", "adapter_config.json"}

const (
	// ResultFile is Ray Train's per-trial report log.
	ResultFile = "result.json"
	// MarkFile is the trainer's completion mark in the experiment folder.
	MarkFile   = "raydrop_result.json"
	trialPre   = "TorchTrainer_"
	maxResult  = 64 << 20
	maxMark    = 4 << 20
	ckptSubdir = "checkpoint"
)

var (
	trialDateRE = regexp.MustCompile(`_(\d{4}-\d{2}-\d{2}_\d{2}-\d{2}-\d{2})$`)
	ckptDirRE   = regexp.MustCompile(`^checkpoint_(\d{6})$`)
)

// Checkpoint is one checkpoint Ray Train persisted.
type Checkpoint struct {
	Name     string             `json:"name"` // checkpoint_00000N
	URI      string             `json:"uri"`  // the folder holding the adapter
	Step     int64              `json:"step"`
	Epoch    float64            `json:"epoch"`
	Metrics  map[string]float64 `json:"metrics"`
	Complete bool               `json:"complete"` // holds every adapter file
}

// Mark is the trainer's completion mark (raydrop_result.json), the fields
// the pipeline reads.
type Mark struct {
	Status string `json:"status"` // succeeded, failed or MarkPreempted
	Error  string `json:"error,omitempty"`
	// NoticeSeen: a preemption notice reached the attempt (a worker pod's
	// preStop hook or the driver's SIGTERM) before it ended. A failed mark
	// with it is a node reclaimed while the save on notice still ran.
	NoticeSeen   bool               `json:"noticeSeen,omitempty"`
	FinalMetrics map[string]float64 `json:"finalMetrics,omitempty"`
	Data         *DataStats         `json:"data,omitempty"`
	Samples      *Samples           `json:"samples,omitempty"`
}

// MarkPreempted is the status of a mark the trainer writes when its nodes
// gave notice of their reclaim: it saved a checkpoint of the step it was on
// and stopped, for the next attempt to resume from.
const MarkPreempted = "preempted"

// Samples are the answers the tuned and the base model gave to held-out
// rows after training, in a JSON file beside the completion mark.
type Samples struct {
	URI     string  `json:"uri"`
	Count   int     `json:"count"`
	Seconds float64 `json:"seconds"` // the time generating them took
}

// DataStats is what the trainer's length filter made of the dataset: rows
// longer than maxSeqLength are left out (truncating would cut the image
// block or the answer), and counted here.
type DataStats struct {
	Rows         int64 `json:"rows"`
	DroppedRows  int64 `json:"droppedRows"`
	MaxSeqLength int64 `json:"maxSeqLength"`
	// EvalRows is how many rows every checkpoint is evaluated on (0: none).
	EvalRows int64 `json:"evalRows"`
}

// Result is what an attempt left in storage.
type Result struct {
	Trial       string             `json:"trial"` // trial folder URI; "" when none was written
	Reports     int                `json:"reports"`
	Checkpoints []Checkpoint       `json:"checkpoints"`
	Latest      *Checkpoint        `json:"latest,omitempty"`
	Best        *Checkpoint        `json:"best,omitempty"`
	BestBy      string             `json:"bestBy,omitempty"`      // the metric Best was chosen by: eval_loss, loss, or "" (the newest)
	LastMetrics map[string]float64 `json:"lastMetrics,omitempty"` // the last report
	// FirstReportAt is when the trainer made its first report (Ray's
	// timestamp, to the second): its first logged optimizer step.
	FirstReportAt *time.Time `json:"firstReportAt,omitempty"`
	// TrainerStartup is the trainer's own account of its start, from its
	// first report; nil when it gave none.
	TrainerStartup *TrainerStartup    `json:"trainerStartup,omitempty"`
	Mark           *Mark              `json:"mark,omitempty"`
	Incomplete     []string           `json:"incomplete,omitempty"` // checkpoints missing adapter files
	FinalMetrics   map[string]float64 `json:"finalMetrics,omitempty"`
}

// Discover reads the experiment folder experiment (a name prefix without a
// trailing slash) and returns its checkpoints, newest last.
func Discover(ctx context.Context, st Store, experiment string) (*Result, error) {
	experiment = strings.TrimSuffix(experiment, "/")
	names, err := st.List(ctx, experiment+"/")
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", st.URI(experiment), err)
	}
	res := &Result{Checkpoints: []Checkpoint{}}
	if m, err := ReadMark(ctx, st, experiment); err != nil {
		return nil, err
	} else if m != nil {
		res.Mark = m
	}
	trial := newestTrial(experiment, names)
	if trial == "" {
		res.FinalMetrics = finalMetrics(res)
		return res, nil
	}
	res.Trial = st.URI(trial)
	present := map[string]bool{}
	for _, n := range names {
		present[n] = true
	}

	lines, err := readResult(ctx, st, trial+"/"+ResultFile)
	if err != nil {
		return nil, err
	}
	res.Reports = len(lines)
	if len(lines) > 0 && !lines[0].at.IsZero() {
		res.FirstReportAt = &lines[0].at
	}
	if len(lines) > 0 {
		res.TrainerStartup = lines[0].startup
	}
	byName := map[string]*Checkpoint{}
	for _, l := range lines {
		res.LastMetrics = l.metrics
		if l.checkpoint == "" || !ckptDirRE.MatchString(l.checkpoint) {
			continue
		}
		dir := trial + "/" + l.checkpoint + "/" + ckptSubdir
		c := &Checkpoint{Name: l.checkpoint, URI: st.URI(dir), Step: int64(l.metrics["step"]), Epoch: l.metrics["epoch"], Metrics: l.metrics, Complete: true}
		for _, f := range AdapterFiles {
			if !present[dir+"/"+f] {
				c.Complete = false
			}
		}
		byName[l.checkpoint] = c
	}
	// A checkpoint folder with no report line (the report was lost with the
	// process) still counts if it is complete; its step is unknown.
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, trial+"/")
		if !ok {
			continue
		}
		dir, _, _ := strings.Cut(rest, "/")
		if ckptDirRE.MatchString(dir) && byName[dir] == nil {
			c := &Checkpoint{Name: dir, URI: st.URI(trial + "/" + dir + "/" + ckptSubdir), Complete: true, Metrics: map[string]float64{}}
			for _, f := range AdapterFiles {
				if !present[trial+"/"+dir+"/"+ckptSubdir+"/"+f] {
					c.Complete = false
				}
			}
			byName[dir] = c
		}
	}
	for _, c := range byName {
		res.Checkpoints = append(res.Checkpoints, *c)
	}
	sort.Slice(res.Checkpoints, func(i, j int) bool { return res.Checkpoints[i].Name < res.Checkpoints[j].Name })
	for i := range res.Checkpoints {
		c := &res.Checkpoints[i]
		if !c.Complete {
			res.Incomplete = append(res.Incomplete, c.URI)
			continue
		}
		res.Latest = c
		if res.Best == nil || Better(c, res.Best) {
			res.Best = c
		}
	}
	if res.Best != nil {
		res.BestBy = RankedBy(res.Best)
	}
	res.FinalMetrics = finalMetrics(res)
	return res, nil
}

// rankingMetrics are the metrics checkpoints are ranked by, in order: the
// loss on the held-out rows, else the training loss.
var rankingMetrics = []string{"eval_loss", "loss"}

// RankedBy is the metric the best checkpoint c was chosen by.
func RankedBy(c *Checkpoint) string {
	for _, k := range rankingMetrics {
		if _, ok := c.Metrics[k]; ok {
			return k
		}
	}
	return ""
}

// Better prefers the lower evaluation loss, else the lower training loss,
// else the later checkpoint.
func Better(a, b *Checkpoint) bool {
	for _, k := range rankingMetrics {
		av, aok := a.Metrics[k]
		bv, bok := b.Metrics[k]
		if aok && bok {
			return av < bv
		}
		if aok != bok {
			return aok
		}
	}
	return a.Name > b.Name
}

func finalMetrics(r *Result) map[string]float64 {
	out := map[string]float64{}
	for k, v := range r.LastMetrics {
		out[k] = v
	}
	if r.Mark != nil {
		for k, v := range r.Mark.FinalMetrics {
			out[k] = v
		}
	}
	if len(out) == 0 {
		return nil
	}
	return out
}

// newestTrial returns the name of the newest trial folder under experiment.
func newestTrial(experiment string, names []string) string {
	seen := map[string]bool{}
	var trials []string
	for _, n := range names {
		rest, ok := strings.CutPrefix(n, experiment+"/")
		if !ok {
			continue
		}
		dir, _, found := strings.Cut(rest, "/")
		if found && strings.HasPrefix(dir, trialPre) && !seen[dir] {
			seen[dir] = true
			trials = append(trials, dir)
		}
	}
	if len(trials) == 0 {
		return ""
	}
	key := func(s string) string {
		if m := trialDateRE.FindStringSubmatch(s); m != nil {
			return m[1] + s
		}
		return s
	}
	sort.Slice(trials, func(i, j int) bool { return key(trials[i]) < key(trials[j]) })
	return path.Join(experiment, trials[len(trials)-1])
}

type report struct {
	metrics    map[string]float64
	checkpoint string
	at         time.Time // Ray's timestamp of the report; zero when absent
	startup    *TrainerStartup
}

// StartupKey is the entry of the trainer's first report that holds its
// TrainerStartup (trainer/worker.py).
const StartupKey = "raydrop_startup"

// TrainerStartup is the trainer's own account of how it started, timed by
// its rank-0 worker: when its train function began (Ray had set up the
// runtime env and started the worker process), the seconds it took to get
// the base model (the node's copy, or the Hub) and load it, and the data
// (processor, rows, length filter, held-out rows), and when its first
// optimizer step ended; and the seconds its driver spent staging the model
// (or waiting for the run that stages it) before the workers started, part
// of the time before StartedAt. Times are Unix seconds.
type TrainerStartup struct {
	StartedAt      float64 `json:"started_at"`
	WeightsSeconds float64 `json:"weights_s"`
	DataSeconds    float64 `json:"data_s"`
	FirstStepAt    float64 `json:"first_step_at"`
	StageSeconds   float64 `json:"stage_s,omitempty"`
}

// Valid says whether the account can be used: times set, durations not
// negative, and the first step after the start.
func (s *TrainerStartup) Valid() bool {
	return s != nil && s.StartedAt > 0 && s.FirstStepAt >= s.StartedAt && s.WeightsSeconds >= 0 && s.DataSeconds >= 0 && s.StageSeconds >= 0
}

// readResult parses result.json: one JSON object per line. A torn last line
// (the writer died mid-write) is skipped.
func readResult(ctx context.Context, st Store, name string) ([]report, error) {
	b, err := st.Read(ctx, name, maxResult)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", st.URI(name), err)
	}
	var out []report
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), maxResult)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		var raw map[string]json.RawMessage
		if err := json.Unmarshal(line, &raw); err != nil {
			continue
		}
		r := report{metrics: map[string]float64{}}
		for k, v := range raw {
			if k == "checkpoint_dir_name" {
				_ = json.Unmarshal(v, &r.checkpoint)
				continue
			}
			if k == StartupKey {
				var su TrainerStartup
				if json.Unmarshal(v, &su) == nil && su.Valid() {
					r.startup = &su
				}
				continue
			}
			var unix int64
			if k == "timestamp" && json.Unmarshal(v, &unix) == nil && unix > 0 {
				r.at = time.Unix(unix, 0).UTC()
			}
			var f float64
			if json.Unmarshal(v, &f) == nil && !math.IsNaN(f) && !math.IsInf(f, 0) && !rayKeys[k] {
				r.metrics[k] = f
			}
		}
		out = append(out, r)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", st.URI(name), err)
	}
	return out, nil
}

// rayKeys are numbers Ray Tune adds to every report; they describe the
// reporting process, not the training.
var rayKeys = map[string]bool{
	"timestamp": true, "pid": true, "training_iteration": true, "time_this_iter_s": true,
	"time_total_s": true, "time_since_restore": true, "iterations_since_restore": true,
	"timesteps_total": true, "timesteps_since_restore": true, "episodes_total": true,
}

// ReadMark reads the trainer's completion mark of an experiment folder; nil
// when the trainer has not written one.
func ReadMark(ctx context.Context, st Store, experiment string) (*Mark, error) {
	name := strings.TrimSuffix(experiment, "/") + "/" + MarkFile
	b, err := st.Read(ctx, name, maxMark)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", st.URI(name), err)
	}
	var raw struct {
		Status       string         `json:"status"`
		Error        *string        `json:"error"`
		FinalMetrics map[string]any `json:"finalMetrics"`
		Data         *DataStats     `json:"data"`
		Samples      *Samples       `json:"samples"`
		NoticeSeen   bool           `json:"noticeSeen"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("parse %s: %w: %w", st.URI(name), ErrUnreadable, err)
	}
	m := &Mark{Status: raw.Status, FinalMetrics: map[string]float64{}, Data: raw.Data, Samples: raw.Samples, NoticeSeen: raw.NoticeSeen}
	if raw.Error != nil {
		m.Error = *raw.Error
	}
	for k, v := range raw.FinalMetrics {
		if f, ok := v.(float64); ok && !math.IsNaN(f) && !math.IsInf(f, 0) {
			m.FinalMetrics[k] = f
		}
	}
	return m, nil
}

// DriverLogFile is the Ray job driver's log in an experiment folder, which
// the trainer copies there while it runs and when it ends.
const DriverLogFile = "driver.log"

// SamplesDir is the folder of the sample answers in an experiment folder:
// samples.json and the images of the held-out rows it names.
const SamplesDir = "samples"

// SamplesFile is the sample answers' JSON file in SamplesDir.
const SamplesFile = "samples.json"

// Series returns the metrics of every report of the newest trial of the
// experiment folder, in the order Ray Train logged them: the training
// curves. The trainer's closing summary (the report holding train_runtime)
// is left out: it repeats the last step with averages over the run.
func Series(ctx context.Context, st Store, experiment string) ([]map[string]float64, error) {
	experiment = strings.TrimSuffix(experiment, "/")
	names, err := st.List(ctx, experiment+"/")
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", st.URI(experiment), err)
	}
	trial := newestTrial(experiment, names)
	if trial == "" {
		return nil, nil
	}
	lines, err := readResult(ctx, st, trial+"/"+ResultFile)
	if err != nil {
		return nil, err
	}
	out := make([]map[string]float64, 0, len(lines))
	for _, l := range lines {
		if _, summary := l.metrics["train_runtime"]; !summary {
			out = append(out, l.metrics)
		}
	}
	return out, nil
}
