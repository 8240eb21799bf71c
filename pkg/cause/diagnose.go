package cause

import (
	"context"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Diagnosis is what `raydrop diagnose` shows of a run that ended other
// than succeeded: its cause, the first error lines of each rank, the pods'
// last states, the events that matter, and where the whole evidence lies.
type Diagnosis struct {
	RunID    string `json:"runId"`
	Phase    string `json:"phase"`
	Reason   string `json:"reason,omitempty"`
	Message  string `json:"message,omitempty"`
	Attempt  int    `json:"attempt"`
	Cause    Cause  `json:"cause"`
	Evidence string `json:"evidence,omitempty"` // the attempt's evidence folder, gs://…/attempt-<n>/
	// Ranks are the first error lines of each rank's own log (its
	// worker-*.err, then .out, as the pods' raylogs sidecars copied them).
	Ranks  []RankErrors `json:"ranks"`
	Pods   []PodState   `json:"pods"`
	Events []EventLine  `json:"events"`
	// Stacks are where each rank's main thread waited, from the stacks the
	// ranks wrote when a stall was suspected (none otherwise); Outside the
	// ranks that waited outside any collective the others waited in.
	Stacks  []RankStack `json:"stacks,omitempty"`
	Outside []int       `json:"outside,omitempty"`
	// Unread says what of the evidence could not be read, if anything.
	Unread string `json:"unread,omitempty"`
}

// RankErrors are the first error lines of one rank's log.
type RankErrors struct {
	Source string   `json:"source"` // the log's path in the evidence folder
	Pod    string   `json:"pod"`
	Rank   int      `json:"rank"` // -1: the log does not say
	Lines  []string `json:"lines"`
}

// PodState is a pod's last state as the evidence kept it.
type PodState struct {
	Pod        string           `json:"pod"`
	Node       string           `json:"node,omitempty"`
	Phase      string           `json:"phase"`
	Deleting   bool             `json:"deleting,omitempty"`
	Containers []ContainerState `json:"containers"`
}

// ContainerState is a container's state, and the one before its last
// restart.
type ContainerState struct {
	Name     string `json:"name"`
	State    string `json:"state"` // running, waiting or terminated
	Reason   string `json:"reason,omitempty"`
	ExitCode *int32 `json:"exitCode,omitempty"`
	Restarts int32  `json:"restarts"`
	// Last is the state before the last restart: "terminated: OOMKilled,
	// exit code 137".
	Last string `json:"last,omitempty"`
}

// EventLine is a Kubernetes event that matters to a failure: every
// warning, and the normal events of a pod's end (Killing, Preempting,
// Evicted...).
type EventLine struct {
	Time    time.Time `json:"time,omitzero"`
	Object  string    `json:"object"` // Kind/name
	Type    string    `json:"type"`
	Reason  string    `json:"reason"`
	Message string    `json:"message"`
	Count   int32     `json:"count,omitempty"`
}

// notableNormal are the reasons of normal events that tell of a pod's end.
var notableNormal = []string{"Killing", "Preempting", "Evicted", "NodeNotReady", "TaintManagerEviction", "Deleted"}

// maxEvents bounds the events a diagnosis shows (the evidence has all).
const maxEvents = 40

// Diagnose reads an attempt's evidence folder (an object prefix,
// evidence.AttemptFolder) in st, every rank's Ray log included, and
// diagnoses the run: rec's recorded cause, or one named now for a run
// concluded before causes were recorded. uri is the folder's gs:// URI
// for people. It needs nothing but the bucket: the cluster may be gone.
func Diagnose(ctx context.Context, st checkpoints.Store, folder, uri string, rec *runs.Record, mark *Mark) Diagnosis {
	d := Diagnosis{RunID: rec.RunID, Phase: string(rec.Phase), Reason: string(rec.Reason), Message: rec.Message, Attempt: rec.Attempt,
		Evidence: uri, Ranks: []RankErrors{}, Pods: []PodState{}, Events: []EventLine{}}
	in := Input{Reason: rec.Reason, Message: rec.Message, Mark: mark}
	if rec.Progress != nil {
		in.Step = rec.Progress.Step
	}
	if folder != "" {
		if err := gather(ctx, st, folder, &in, true); err != nil {
			d.Unread = err.Error()
		}
		stacks, err := ReadStacks(ctx, st, folder)
		if err != nil && d.Unread == "" {
			d.Unread = err.Error()
		}
		d.Stacks, d.Outside = stacks, Outside(stacks)
	}
	if rec.Cause != nil {
		d.Cause = *rec.Cause
	} else {
		d.Cause = Classify(in)
	}
	for _, l := range in.Logs {
		if b := path.Base(l.Source); !strings.HasPrefix(l.Source, evidence.RayFolder+"/") || !strings.HasPrefix(b, "worker-") {
			continue
		}
		lines := strings.Split(l.Text, "\n")
		if first := firstError(lines); first != nil {
			d.Ranks = append(d.Ranks, RankErrors{Source: l.Source, Pod: l.Pod, Rank: rankOf(lines), Lines: first})
		}
	}
	for _, p := range in.Pods {
		d.Pods = append(d.Pods, podState(p))
	}
	for _, e := range in.Events {
		if e.Type == corev1.EventTypeWarning || slices.Contains(notableNormal, e.Reason) {
			d.Events = append(d.Events, EventLine{Time: eventTime(e), Object: e.InvolvedObject.Kind + "/" + e.InvolvedObject.Name,
				Type: e.Type, Reason: e.Reason, Message: e.Message, Count: e.Count})
		}
	}
	slices.SortStableFunc(d.Events, func(a, b EventLine) int { return a.Time.Compare(b.Time) })
	if len(d.Events) > maxEvents {
		d.Events = d.Events[len(d.Events)-maxEvents:]
	}
	return d
}

// firstError is the first error a log shows: a line of a known cause, or
// an exception with the frames before it, with the lines that follow it;
// nil for a log without one.
func firstError(lines []string) []string {
	for i, line := range lines {
		switch {
		case slices.ContainsFunc(signatures, func(s signature) bool { return s.re.MatchString(line) }):
			return block(lines, i, line)
		case tracebackRE.MatchString(line):
			if exc := exceptionOf(lines, i, "", 2); exc != nil {
				return exc
			}
		case exceptionRE.MatchString(line):
			return block(lines, i, line)
		}
	}
	return nil
}

func podState(p evidence.PodRecord) PodState {
	s := PodState{Pod: p.Name, Node: p.Node, Phase: string(p.Status.Phase), Deleting: p.Deleting, Containers: []ContainerState{}}
	for _, c := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
		cs := ContainerState{Name: c.Name, Restarts: c.RestartCount}
		switch st := c.State; {
		case st.Running != nil:
			cs.State = "running"
		case st.Waiting != nil:
			cs.State, cs.Reason = "waiting", st.Waiting.Reason
		case st.Terminated != nil:
			code := st.Terminated.ExitCode
			cs.State, cs.Reason, cs.ExitCode = "terminated", st.Terminated.Reason, &code
		}
		if t := c.LastTerminationState.Terminated; t != nil {
			cs.Last = fmt.Sprintf("terminated: %s, exit code %d", t.Reason, t.ExitCode)
		}
		s.Containers = append(s.Containers, cs)
	}
	return s
}

func eventTime(e corev1.Event) time.Time {
	for _, t := range []time.Time{e.LastTimestamp.Time, e.EventTime.Time, e.FirstTimestamp.Time, e.CreationTimestamp.Time} {
		if !t.IsZero() {
			return t
		}
	}
	return time.Time{}
}
