// Package evidence keeps what a run's pods can tell about how it ended
// before its workers are scaled down: every Ray pod's and the submitter
// pod's container logs (read through the API server's pod log endpoint,
// the last LogCap bytes of each, gzipped), the pods' statuses, the
// Kubernetes events of the run's objects, and a manifest of what was
// captured and what could not be. It writes them under the run's folder:
//
//	<run folder>/evidence/attempt-<n>/
//	  manifest.json                      what is here, what is missing and why
//	  pods.json                          each pod's node and status
//	  nodes.json                         those nodes' labels, conditions, taints
//	  events.json                        the events of the RayJob, RayCluster, submitter Job and pods
//	  logs/<pod>/<container>.log.gz      a container's log (its last LogCap bytes)
//	  logs/<pod>/<container>.previous.log.gz
//	                                     the container that ran before a restart
//	  ray/<pod>/                         the node's Ray logs, copied by the pod's
//	                                     raylogs sidecar while it lived (RayFolder)
//
// A capture never runs longer than its budget: when the budget is spent,
// what is left is named missing in the manifest and the teardown goes on.
// Every file is created once (a retried capture leaves an earlier try's
// files as they are and writes the rest).
package evidence

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Folder is the name of the evidence folder in a run's folder.
const Folder = "evidence"

// ManifestFile is the manifest's name in an attempt's evidence folder.
const ManifestFile = "manifest.json"

// RayFolder is the folder in an attempt's evidence folder where the Ray
// pods' raylogs sidecars copy their nodes' Ray logs, one folder per pod
// (trainer/raylogs.py; not listed in the manifest: the nodes write it
// while they live, and a worker's last copy may come after the manifest).
const RayFolder = "ray"

// Defaults of a deployment's capture settings.
const (
	DefaultBudget = 60 * time.Second
	DefaultLogCap = 2 << 20
)

// AttemptFolder is an attempt's evidence folder under the run's folder
// (an object prefix, without a trailing slash).
func AttemptFolder(runFolder string, attempt int) string {
	return fmt.Sprintf("%s/%s/attempt-%d", runFolder, Folder, attempt)
}

// URI is the gs:// URI of a run's evidence folder: the run's folder in
// bucket, then evidence/.
func URI(bucket, runFolder string) string {
	return "gs://" + bucket + "/" + runFolder + "/" + Folder + "/"
}

// Locate is the bucket and the attempt's folder (an object prefix, as
// AttemptFolder gives it) of an evidence folder's URI, as URI writes it.
func Locate(uri string, attempt int) (bucket, folder string, err error) {
	bucket, prefix, ok := strings.Cut(strings.TrimPrefix(uri, "gs://"), "/")
	runFolder, isEvidence := strings.CutSuffix(prefix, "/"+Folder+"/")
	if !ok || !strings.HasPrefix(uri, "gs://") || !isEvidence || runFolder == "" {
		return "", "", fmt.Errorf("%q is not an evidence folder (gs://<bucket>/<run folder>/%s/)", uri, Folder)
	}
	return bucket, AttemptFolder(runFolder, attempt), nil
}

// Target is what a capture reads: the attempt's RayCluster and RayJob (its
// submitter Job has the RayJob's name).
type Target struct {
	RunID     string
	Attempt   int
	Namespace string
	Cluster   string
	RayJob    string
}

// Options bound a capture.
type Options struct {
	// Budget is the longest a capture reads and writes before it gives up
	// on what is left (the manifest's own write is not counted).
	Budget time.Duration
	// LogCap is how many bytes of each container log are kept: the last.
	LogCap int64
}

// Writer creates the evidence's objects, each once.
type Writer interface {
	// Create writes a new object named name (relative to the attempt's
	// folder); ErrExists when an earlier capture wrote it.
	Create(ctx context.Context, name string, data []byte, contentType string) error
}

// ErrExists is what Writer.Create returns for a name already written.
var ErrExists = errors.New("already written")

// Manifest is manifest.json (schemas/evidence.v1.json).
type Manifest struct {
	SchemaVersion int       `json:"schemaVersion"`
	RunID         string    `json:"runId"`
	Attempt       int       `json:"attempt"`
	Namespace     string    `json:"namespace"`
	Cluster       string    `json:"cluster"`
	RayJob        string    `json:"rayJob"`
	StartedAt     time.Time `json:"startedAt"`
	FinishedAt    time.Time `json:"finishedAt"`
	BudgetSeconds float64   `json:"budgetSeconds"`
	LogCapBytes   int64     `json:"logCapBytes"`
	// Complete: everything the capture looked for is here.
	Complete bool      `json:"complete"`
	Files    []File    `json:"files"`
	Missing  []Missing `json:"missing"`
}

// File is one captured file.
type File struct {
	Path string `json:"path"` // relative to the attempt's evidence folder
	Kind string `json:"kind"` // log, pods or events
	// Pod and Container name a log's container; Previous marks the one
	// that ran before its restart.
	Pod       string `json:"pod,omitempty"`
	Container string `json:"container,omitempty"`
	Previous  bool   `json:"previous,omitempty"`
	// Bytes is the file's size as stored (gzipped for a log); LogBytes is
	// what the log held before it was capped, Capped whether it was.
	Bytes    int   `json:"bytes"`
	LogBytes int64 `json:"logBytes,omitempty"`
	Capped   bool  `json:"capped,omitempty"`
	// Earlier: an earlier capture of the attempt wrote the file (a retried
	// delivery); its size is not known to this one.
	Earlier bool `json:"earlier,omitempty"`
}

// Missing is something the capture looked for and did not get.
type Missing struct {
	What string `json:"what"`
	Why  string `json:"why"`
}

// The kinds of captured files.
const (
	KindLog    = "log"
	KindPods   = "pods"
	KindNodes  = "nodes"
	KindEvents = "events"
)

// NodeRecord is a node as nodes.json keeps it: what GKE labelled it (node
// pool, accelerator, Spot or reservation, zone), its conditions (Ready,
// MemoryPressure, DiskPressure, ...), its taints and what it offered.
type NodeRecord struct {
	Name          string                 `json:"name"`
	Labels        map[string]string      `json:"labels,omitempty"`
	Unschedulable bool                   `json:"unschedulable,omitempty"`
	Taints        []corev1.Taint         `json:"taints,omitempty"`
	Conditions    []corev1.NodeCondition `json:"conditions,omitempty"`
	Allocatable   corev1.ResourceList    `json:"allocatable,omitempty"`
	// Deleting: the node was being deleted (a scale-down, a reclaimed
	// Spot VM).
	Deleting bool `json:"deleting,omitempty"`
}

// PodRecord is a pod as pods.json keeps it: its node and its status
// (phase, reason, conditions, each container's state, exit code, reason
// and restart count).
type PodRecord struct {
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels,omitempty"`
	Node   string            `json:"node,omitempty"`
	// Deleting: the pod was being deleted (a scale-down, a lost node).
	Deleting bool             `json:"deleting,omitempty"`
	Status   corev1.PodStatus `json:"status"`
}

// Reading the logs of several containers at once keeps a capture of many
// pods within its budget.
const parallelLogs = 4

// Capture reads what the target's pods can tell and writes it through w.
// It returns the manifest, written last; the error is only the manifest's
// own write failing (what could not be captured is in the manifest).
func Capture(ctx context.Context, kube corev1client.CoreV1Interface, w Writer, t Target, o Options, now func() time.Time) (*Manifest, error) {
	m := &Manifest{
		SchemaVersion: 1, RunID: t.RunID, Attempt: t.Attempt, Namespace: t.Namespace, Cluster: t.Cluster, RayJob: t.RayJob,
		StartedAt: now(), BudgetSeconds: o.Budget.Seconds(), LogCapBytes: o.LogCap,
		Files: []File{}, Missing: []Missing{},
	}
	c := &capture{kube: kube, w: w, t: t, o: o, m: m}
	budget, cancel := context.WithTimeout(ctx, o.Budget)
	defer cancel()
	pods := c.pods(budget)
	c.nodes(budget, pods)
	c.events(budget, pods)
	c.logs(budget, pods)
	sort.Slice(m.Files, func(i, j int) bool { return m.Files[i].Path < m.Files[j].Path })
	m.Complete = len(m.Missing) == 0
	m.FinishedAt = now()
	doc, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return m, err
	}
	// The manifest is written even when the budget is spent: it says what
	// is missing. It gets a short time of its own.
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), 15*time.Second)
	defer wcancel()
	if err := w.Create(wctx, ManifestFile, doc, "application/json"); err != nil && !errors.Is(err, ErrExists) {
		return m, fmt.Errorf("write the evidence manifest of run %s attempt %d: %w", t.RunID, t.Attempt, err)
	}
	return m, nil
}

// capture is one capture under way.
type capture struct {
	kube corev1client.CoreV1Interface
	w    Writer
	t    Target
	o    Options
	mu   sync.Mutex
	m    *Manifest
}

func (c *capture) missing(what, why string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m.Missing = append(c.m.Missing, Missing{What: what, Why: why})
}

func (c *capture) file(f File) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.m.Files = append(c.m.Files, f)
}

// write creates one file and records it (or why it is missing).
func (c *capture) write(ctx context.Context, f File, data []byte, contentType string) {
	err := c.w.Create(ctx, f.Path, data, contentType)
	switch {
	case errors.Is(err, ErrExists):
		c.file(File{Path: f.Path, Kind: f.Kind, Pod: f.Pod, Container: f.Container, Previous: f.Previous, Earlier: true})
	case err != nil:
		c.missing(f.Path, why(ctx, "write", err))
	default:
		f.Bytes = len(data)
		c.file(f)
	}
}

// why says why a read or write did not happen: the budget, or the error.
func why(ctx context.Context, what string, err error) string {
	if ctx.Err() != nil {
		return "the capture's budget was spent before it could " + what + " it"
	}
	return what + ": " + err.Error()
}

// pods lists the cluster's pods and the submitter Job's, and writes
// pods.json.
func (c *capture) pods(ctx context.Context) []corev1.Pod {
	var pods []corev1.Pod
	for _, sel := range []string{
		"ray.io/cluster=" + c.t.Cluster,
		"batch.kubernetes.io/job-name=" + c.t.RayJob,
	} {
		if c.t.Cluster == "" && strings.HasPrefix(sel, "ray.io") || c.t.RayJob == "" && strings.HasPrefix(sel, "batch") {
			continue
		}
		list, err := c.kube.Pods(c.t.Namespace).List(ctx, metav1.ListOptions{LabelSelector: sel})
		if err != nil {
			c.missing("the pods ("+sel+")", why(ctx, "list", kubeErr(err)))
			continue
		}
		pods = append(pods, list.Items...)
	}
	sort.Slice(pods, func(i, j int) bool { return pods[i].Name < pods[j].Name })
	pods = slices.CompactFunc(pods, func(a, b corev1.Pod) bool { return a.Name == b.Name })
	recs := make([]PodRecord, 0, len(pods))
	for _, p := range pods {
		recs = append(recs, PodRecord{Name: p.Name, Labels: p.Labels, Node: p.Spec.NodeName, Deleting: p.DeletionTimestamp != nil, Status: p.Status})
	}
	doc, _ := json.MarshalIndent(recs, "", "  ")
	c.write(ctx, File{Path: "pods.json", Kind: KindPods}, doc, "application/json")
	return pods
}

// nodes writes the pods' nodes: gone with the pods once the workers are
// scaled down (GKE removes an idle GPU node), and with them what the node
// said of itself.
func (c *capture) nodes(ctx context.Context, pods []corev1.Pod) {
	var names []string
	for _, p := range pods {
		if p.Spec.NodeName != "" && !slices.Contains(names, p.Spec.NodeName) {
			names = append(names, p.Spec.NodeName)
		}
	}
	slices.Sort(names)
	recs := []NodeRecord{}
	for _, name := range names {
		n, err := c.kube.Nodes().Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			c.missing("node "+name, why(ctx, "get", kubeErr(err)))
			continue
		}
		recs = append(recs, NodeRecord{
			Name: n.Name, Labels: n.Labels, Unschedulable: n.Spec.Unschedulable, Taints: n.Spec.Taints,
			Conditions: n.Status.Conditions, Allocatable: n.Status.Allocatable, Deleting: n.DeletionTimestamp != nil,
		})
	}
	doc, _ := json.MarshalIndent(recs, "", "  ")
	c.write(ctx, File{Path: "nodes.json", Kind: KindNodes}, doc, "application/json")
}

// events writes the events of the RayJob, the RayCluster, the submitter
// Job and the pods (those still listed, and those gone whose names are
// the cluster's or the submitter's).
func (c *capture) events(ctx context.Context, pods []corev1.Pod) {
	list, err := c.kube.Events(c.t.Namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		c.missing("events.json", why(ctx, "list the events for", kubeErr(err)))
		return
	}
	names := map[string]bool{}
	for _, p := range pods {
		names[p.Name] = true
	}
	podOf := podNames(c.t)
	var out []corev1.Event
	for _, e := range list.Items {
		o := e.InvolvedObject
		if c.ofTarget(o, names, podOf) {
			e.ManagedFields = nil
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return eventTime(&out[i]).Before(eventTime(&out[j])) })
	if out == nil {
		out = []corev1.Event{}
	}
	doc, _ := json.MarshalIndent(out, "", "  ")
	c.write(ctx, File{Path: "events.json", Kind: KindEvents}, doc, "application/json")
}

// ofTarget reports whether an event is about one of the target's objects.
func (c *capture) ofTarget(o corev1.ObjectReference, pods map[string]bool, podOf *regexp.Regexp) bool {
	switch o.Kind {
	case "RayJob":
		return o.Name == c.t.RayJob
	case "RayCluster":
		return o.Name == c.t.Cluster
	case "Job":
		return o.Name == c.t.RayJob
	case "Pod":
		return pods[o.Name] || podOf.MatchString(o.Name)
	}
	return false
}

// podNames matches the names KubeRay and the Job controller give the
// target's pods: <cluster>-head-xxxxx, <cluster>-<group>-worker-xxxxx and
// <rayjob>-xxxxx.
func podNames(t Target) *regexp.Regexp {
	alt := []string{}
	if t.Cluster != "" {
		c := regexp.QuoteMeta(t.Cluster)
		alt = append(alt, c+`-head(-[a-z0-9]{5})?`, c+`-[a-z0-9-]+-worker-[a-z0-9]{5}`)
	}
	if t.RayJob != "" {
		alt = append(alt, regexp.QuoteMeta(t.RayJob)+`-[a-z0-9]{5}`)
	}
	if len(alt) == 0 {
		return regexp.MustCompile(`^$`)
	}
	return regexp.MustCompile(`^(` + strings.Join(alt, "|") + `)$`)
}

// eventTime is when an event last happened.
func eventTime(e *corev1.Event) time.Time {
	switch {
	case !e.LastTimestamp.IsZero():
		return e.LastTimestamp.Time
	case !e.EventTime.IsZero():
		return e.EventTime.Time
	}
	return e.CreationTimestamp.Time
}

// logs reads every container's log (and the previous one's, where a
// container restarted), a few at once.
func (c *capture) logs(ctx context.Context, pods []corev1.Pod) {
	type job struct {
		pod, container string
		previous       bool
	}
	var jobs []job
	for _, p := range pods {
		for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			if s.State.Running != nil || s.State.Terminated != nil {
				jobs = append(jobs, job{p.Name, s.Name, false})
			} else {
				c.missing(logPath(p.Name, s.Name, false), "the container never started: "+waiting(s))
			}
			if s.RestartCount > 0 || s.LastTerminationState.Terminated != nil {
				jobs = append(jobs, job{p.Name, s.Name, true})
			}
		}
	}
	sem := make(chan struct{}, parallelLogs)
	var wg sync.WaitGroup
	for _, j := range jobs {
		wg.Go(func() {
			select {
			case sem <- struct{}{}:
			case <-ctx.Done():
				c.missing(logPath(j.pod, j.container, j.previous), why(ctx, "read", ctx.Err()))
				return
			}
			defer func() { <-sem }()
			c.log(ctx, j.pod, j.container, j.previous)
		})
	}
	wg.Wait()
}

// waiting says why a container that never ran waited.
func waiting(s corev1.ContainerStatus) string {
	if w := s.State.Waiting; w != nil {
		return strings.TrimSuffix(w.Reason+": "+w.Message, ": ")
	}
	return "no state"
}

// logPath is where a container's log is kept in the attempt's folder.
func logPath(pod, container string, previous bool) string {
	name := container + ".log.gz"
	if previous {
		name = container + ".previous.log.gz"
	}
	return path.Join("logs", pod, name)
}

// log reads one container's log through the API server and writes its
// last LogCap bytes, gzipped.
func (c *capture) log(ctx context.Context, pod, container string, previous bool) {
	f := File{Path: logPath(pod, container, previous), Kind: KindLog, Pod: pod, Container: container, Previous: previous}
	stream, err := c.kube.Pods(c.t.Namespace).GetLogs(pod, &corev1.PodLogOptions{Container: container, Previous: previous}).Stream(ctx)
	if err != nil {
		c.missing(f.Path, why(ctx, "read", kubeErr(err)))
		return
	}
	defer func() { _ = stream.Close() }()
	tail := newTail(c.o.LogCap)
	n, err := io.Copy(tail, stream)
	f.LogBytes, f.Capped = n, n > c.o.LogCap
	if err != nil {
		// What was read is kept; the manifest says it was cut short.
		c.missing(f.Path+" (the end of the log)", why(ctx, "read", err))
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	_, _ = zw.Write(tail.Bytes())
	_ = zw.Close()
	c.write(ctx, f, gz.Bytes(), "application/gzip")
}

// kubeErr names what the API server's refusal means for a capture.
func kubeErr(err error) error {
	switch {
	case apierrors.IsNotFound(err):
		return fmt.Errorf("gone: %w", err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("not allowed (the capturing identity needs list on pods and events and get on pods/log in the namespace, get on nodes): %w", err)
	}
	return err
}

// tail keeps the last n bytes written to it.
type tail struct {
	n   int64
	buf []byte
}

func newTail(n int64) *tail { return &tail{n: n} }

func (t *tail) Write(p []byte) (int, error) {
	if int64(len(p)) >= t.n {
		t.buf = append(t.buf[:0], p[int64(len(p))-t.n:]...)
		return len(p), nil
	}
	if over := int64(len(t.buf)+len(p)) - t.n; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return len(p), nil
}

// Bytes is what the tail holds.
func (t *tail) Bytes() []byte { return t.buf }
