// Package cause names why a run failed, from what it left: the run's
// reason, the trainer's completion mark, and the evidence kept before the
// teardown (pods' statuses, Kubernetes events, the driver's output and
// each rank's own log). Classify is a pure function: the same input gives
// the same cause.
//
// The causes, and what each is read from:
//
//   - OOMKilled: a Ray container terminated with reason OOMKilled (the
//     kernel's OOM killer, at the container's memory limit; exit code 137
//     alone only means SIGKILL);
//   - HostOutOfMemory: Ray's memory monitor killed a worker
//     (ray.exceptions.OutOfMemoryError, "Task was killed due to the node
//     running low on memory");
//   - CudaOutOfMemory: PyTorch's caching allocator ran out of GPU memory
//     (torch.OutOfMemoryError, "CUDA out of memory. Tried to allocate");
//   - NcclTimeout: ProcessGroupNCCL's watchdog timed a collective out
//     ("Watchdog caught collective operation timeout");
//   - NcclError: NCCL itself failed (DistBackendError, ncclSystemError,
//     ncclInternalError, ncclRemoteError, ncclUnhandledCudaError);
//   - GpuError: a CUDA error of the device (an illegal memory access, an
//     uncorrectable ECC error, an unspecified launch failure), read from
//     the ranks' output: a pod cannot read its node's kernel log, where
//     the Xid codes are;
//   - ImagePull: a Ray or submitter pod waiting in ErrImagePull,
//     ImagePullBackOff or InvalidImageName, or the kubelet's "Failed to
//     pull image" event;
//   - DataError: the data check refused the data (InvalidData), or the
//     trainer raised its DataError;
//   - PythonException: any other exception, with its type and last frames,
//     from the rank that raised first;
//   - Preempted, Stalled, DeadlineExceeded, Cancelled: from the run's
//     reason (and the trainer's preempted mark);
//   - Unknown: nothing above.
//
// Where several show, the order above the list's end decides, except that
// the log signatures compete by position: the first line of the driver's
// output that shows one wins (the rank that failed first), then the
// ranks' own files in the order given.
package cause

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Kind is a failure cause.
type Kind string

// The causes (see the package's documentation for what each is read from).
const (
	OOMKilled        Kind = "OOMKilled"
	HostOutOfMemory  Kind = "HostOutOfMemory"
	CudaOutOfMemory  Kind = "CudaOutOfMemory"
	NcclTimeout      Kind = "NcclTimeout"
	NcclError        Kind = "NcclError"
	GpuError         Kind = "GpuError"
	ImagePull        Kind = "ImagePull"
	DataError        Kind = "DataError"
	PythonException  Kind = "PythonException"
	Preempted        Kind = "Preempted"
	Stalled          Kind = "Stalled"
	DeadlineExceeded Kind = "DeadlineExceeded"
	Cancelled        Kind = "Cancelled"
	Unknown          Kind = "Unknown"
)

// Kinds is every cause, in the order the package documents them.
var Kinds = []Kind{OOMKilled, HostOutOfMemory, CudaOutOfMemory, NcclTimeout, NcclError, GpuError, ImagePull, DataError,
	PythonException, Preempted, Stalled, DeadlineExceeded, Cancelled, Unknown}

// Input is what a failed run left.
type Input struct {
	// Reason and Message are the run's (runs.Record).
	Reason  runs.Reason
	Message string
	// Mark is the trainer's completion mark of the last attempt, nil if it
	// wrote none.
	Mark *Mark
	// Step is the last step the attempt reported (0: none).
	Step int64
	// Pods and Events are the evidence's pods.json and events.json.
	Pods   []evidence.PodRecord
	Events []corev1.Event
	// Logs are the texts to read error lines from: the driver's output
	// first (its order says which rank failed first), then the ranks' own
	// files.
	Logs []Log
	// Stacks are where the ranks waited, when they wrote their stacks (a
	// suspected stall).
	Stacks []RankStack
}

// Mark is what Classify reads of the trainer's completion mark.
type Mark struct {
	Status string // succeeded, failed or preempted
	Error  string
}

// Log is a text that may hold error lines.
type Log struct {
	Source string // where it was read: an evidence path or a URI
	Pod    string // the pod that wrote it, when known
	Text   string
}

// Cause is why a run failed.
type Cause = runs.Cause

// signature is a cause read from log lines.
type signature struct {
	kind Kind
	re   *regexp.Regexp
}

// signatures are the log-read causes. A line is tried against each in
// this order; the first line that matches any wins.
var signatures = []signature{
	{CudaOutOfMemory, regexp.MustCompile(`torch\.OutOfMemoryError: CUDA out of memory|CUDA out of memory\. Tried to allocate`)},
	{HostOutOfMemory, regexp.MustCompile(`ray\.exceptions\.OutOfMemoryError: Task was killed due to the node running low on memory|Workers \(tasks / actors\) killed due to memory pressure \(OOM\)`)},
	{NcclTimeout, regexp.MustCompile(`Watchdog caught collective operation timeout`)},
	{NcclError, regexp.MustCompile(`DistBackendError: NCCL error|NCCL error in: |nccl(SystemError|InternalError|RemoteError|UnhandledCudaError|InvalidUsage)\b`)},
	{GpuError, regexp.MustCompile(`CUDA error: (an illegal memory access was encountered|uncorrectable ECC error encountered|unspecified launch failure|misaligned address|the launch timed out and was terminated)`)},
	{DataError, regexp.MustCompile(`\bDataError: `)},
}

var (
	// rayPrefix is what Ray puts before a worker's line on the driver.
	rayPrefix = regexp.MustCompile(`^\((?:RayTrainWorker|[\w.]+) pid=(\d+), ip=([\d.:a-f]+)\)\s?`)
	// rankRE finds a rank number in NCCL's and Ray Train's lines.
	rankRE       = regexp.MustCompile(`\[rank(\d+)\]|\brank=(\d+)\b|\bRank (\d+)\]`)
	exceptionRE  = regexp.MustCompile(`^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))(?::\s|$)`)
	frameRE      = regexp.MustCompile(`^\s*File "[^"]+", line \d+, in `)
	tracebackRE  = regexp.MustCompile(`^Traceback \(most recent call last\):`)
	imagePullWRE = regexp.MustCompile(`^(ErrImagePull|ImagePullBackOff|InvalidImageName|ErrImageNeverPull)$`)
)

// markSource is the Source of a cause read from the trainer's mark.
const markSource = "the trainer's completion mark"

// contextLines is how many lines after the matching one a cause keeps.
const contextLines = 4

// Classify names the cause of a failed run.
func Classify(in Input) Cause {
	c := classify(in)
	if c.Step == 0 {
		c.Step = in.Step
	}
	c.Summary = summary(c, in)
	c.Hint = hints[Kind(c.Kind)]
	return c
}

func classify(in Input) Cause {
	if in.Reason == runs.ReasonCancelled {
		return Cause{Kind: string(Cancelled), Rank: -1}
	}
	if c, ok := imagePull(in); ok {
		return c
	}
	if c, ok := oomKilled(in); ok {
		return c
	}
	if c, ok := fromLogs(in); ok {
		return c
	}
	if in.Mark != nil && in.Mark.Error != "" {
		for _, s := range signatures {
			if s.re.MatchString(in.Mark.Error) {
				return Cause{Kind: string(s.kind), Rank: -1, Lines: []string{in.Mark.Error}, Source: markSource}
			}
		}
	}
	switch {
	case in.Reason == runs.Preempted || (in.Mark != nil && in.Mark.Status == "preempted"):
		return Cause{Kind: string(Preempted), Rank: -1}
	case in.Reason == runs.Stalled:
		return stalled(in)
	case in.Reason == runs.DeadlineExceeded || in.Reason == runs.StartDeadlineExceeded:
		return Cause{Kind: string(DeadlineExceeded), Rank: -1}
	case in.Reason == runs.InvalidData:
		return Cause{Kind: string(DataError), Rank: -1, Lines: []string{in.Message}, Source: "the data check"}
	}
	if c, ok := pythonException(in); ok {
		return c
	}
	return Cause{Kind: string(Unknown), Rank: -1}
}

// imagePull finds a pod that cannot pull its image.
func imagePull(in Input) (Cause, bool) {
	for _, p := range in.Pods {
		for _, s := range slices.Concat(p.Status.InitContainerStatuses, p.Status.ContainerStatuses) {
			if w := s.State.Waiting; w != nil && imagePullWRE.MatchString(w.Reason) {
				line := fmt.Sprintf("%s/%s: %s: %s", p.Name, s.Name, w.Reason, w.Message)
				return Cause{Kind: string(ImagePull), Rank: -1, Pod: p.Name, Lines: append([]string{line}, pullEvents(in, p.Name)...), Source: "pods.json"}, true
			}
		}
	}
	for _, e := range in.Events {
		if e.InvolvedObject.Kind == "Pod" && e.Reason == "Failed" && strings.Contains(e.Message, "Failed to pull image") {
			return Cause{Kind: string(ImagePull), Rank: -1, Pod: e.InvolvedObject.Name, Lines: []string{e.Message}, Source: "events.json"}, true
		}
	}
	return Cause{}, false
}

// pullEvents are the kubelet's pull failures of a pod.
func pullEvents(in Input, pod string) []string {
	var out []string
	for _, e := range in.Events {
		if e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == pod && e.Reason == "Failed" && strings.Contains(e.Message, "Failed to pull image") {
			out = append(out, e.Message)
		}
	}
	return out
}

// oomKilled finds a container the kernel's OOM killer ended.
func oomKilled(in Input) (Cause, bool) {
	for _, p := range in.Pods {
		for _, s := range p.Status.ContainerStatuses {
			for _, t := range []*corev1.ContainerStateTerminated{s.State.Terminated, s.LastTerminationState.Terminated} {
				if t != nil && t.Reason == "OOMKilled" {
					line := fmt.Sprintf("%s/%s: terminated with exit code %d, reason OOMKilled (restarts: %d)", p.Name, s.Name, t.ExitCode, s.RestartCount)
					return Cause{Kind: string(OOMKilled), Rank: -1, Pod: p.Name, Lines: []string{line}, Source: "pods.json"}, true
				}
			}
		}
	}
	return Cause{}, false
}

// fromLogs finds the first line of the logs that shows a signature.
func fromLogs(in Input) (Cause, bool) {
	for _, l := range in.Logs {
		lines := strings.Split(l.Text, "\n")
		for i, line := range lines {
			body := rayPrefix.ReplaceAllString(line, "")
			for _, s := range signatures {
				if !s.re.MatchString(body) {
					continue
				}
				c := Cause{Kind: string(s.kind), Rank: -1, Pod: writer(in.Pods, l, line), Source: l.Source}
				c.Lines = block(lines, i, line)
				c.Rank = rankOf(c.Lines)
				return c, true
			}
		}
	}
	return Cause{}, false
}

// block is the matching line and the next few of the same writer (the
// same Ray prefix on the driver).
func block(lines []string, i int, line string) []string {
	prefix := rayPrefix.FindString(line)
	out := []string{strings.TrimPrefix(line, prefix)}
	for _, next := range lines[i+1:] {
		if len(out) > contextLines || strings.TrimSpace(next) == "" {
			break
		}
		if prefix != "" && !strings.HasPrefix(next, prefix) {
			continue
		}
		out = append(out, strings.TrimPrefix(next, prefix))
	}
	return out
}

// rankOf is the first rank the lines name, or -1.
func rankOf(lines []string) int {
	for _, l := range lines {
		if m := rankRE.FindStringSubmatch(l); m != nil {
			for _, g := range m[1:] {
				if n, err := strconv.Atoi(g); err == nil {
					return n
				}
			}
		}
	}
	return -1
}

// writer is the pod that wrote a line: the one whose IP the line's Ray
// prefix names (a worker's line on the driver), else the log's.
func writer(pods []evidence.PodRecord, l Log, line string) string {
	if p := podOf(pods, line); p != "" {
		return p
	}
	return l.Pod
}

// podOf is the pod whose IP a driver line's Ray prefix names.
func podOf(pods []evidence.PodRecord, line string) string {
	m := rayPrefix.FindStringSubmatch(line)
	if m == nil {
		return ""
	}
	for _, p := range pods {
		if p.Status.PodIP == m[2] {
			return p.Name
		}
	}
	return ""
}

// pythonException finds the first traceback of the logs (its exception
// and last frames), else an exception line in the mark's error or the
// run's message.
func pythonException(in Input) (Cause, bool) {
	for _, l := range in.Logs {
		lines := strings.Split(l.Text, "\n")
		for i, line := range lines {
			prefix := rayPrefix.FindString(line)
			if !tracebackRE.MatchString(strings.TrimPrefix(line, prefix)) {
				continue
			}
			if exc := exceptionOf(lines, i, prefix, 3); exc != nil {
				c := Cause{Kind: string(PythonException), Rank: -1, Pod: writer(in.Pods, l, line), Source: l.Source, Lines: exc}
				c.Rank = rankOf(c.Lines)
				return c, true
			}
		}
	}
	for _, text := range []string{markError(in), in.Message} {
		for _, line := range strings.Split(text, "\n") {
			if exceptionRE.MatchString(strings.TrimSpace(line)) {
				return Cause{Kind: string(PythonException), Rank: -1, Lines: []string{strings.TrimSpace(line)}, Source: markSource}, true
			}
		}
	}
	return Cause{}, false
}

// exceptionOf is the exception the traceback that starts at lines[i]
// ends in, then its last frames (at most keep), reading only the lines of
// the writer whose Ray prefix is prefix; nil when it ends in none.
func exceptionOf(lines []string, i int, prefix string, keep int) []string {
	var frames []string
	for _, next := range lines[i+1:] {
		if !strings.HasPrefix(next, prefix) {
			continue
		}
		body := strings.TrimPrefix(next, prefix)
		switch {
		case frameRE.MatchString(body):
			frames = append(frames, strings.TrimSpace(body))
		case exceptionRE.MatchString(body):
			if len(frames) > keep {
				frames = frames[len(frames)-keep:]
			}
			return append([]string{body}, frames...)
		}
	}
	return nil
}

func markError(in Input) string {
	if in.Mark == nil {
		return ""
	}
	return in.Mark.Error
}

// Exception is the exception type a PythonException's first line names.
func Exception(c Cause) string {
	if len(c.Lines) == 0 {
		return ""
	}
	if m := exceptionRE.FindStringSubmatch(c.Lines[0]); m != nil {
		return m[1]
	}
	return ""
}

// summary is the cause in one line.
func summary(c Cause, in Input) string {
	where := ""
	if c.Step > 0 {
		where += fmt.Sprintf(" after step %d", c.Step)
	}
	if c.Rank >= 0 {
		where += fmt.Sprintf(" on rank %d", c.Rank)
	}
	if c.Pod != "" {
		where += " (pod " + c.Pod + ")"
	}
	first := ""
	if len(c.Lines) > 0 {
		first = c.Lines[0]
		if len(first) > 200 {
			first = first[:200] + "…"
		}
	}
	switch Kind(c.Kind) {
	case OOMKilled:
		return "a container was killed at its memory limit (OOMKilled)" + where
	case HostOutOfMemory:
		return "Ray's memory monitor killed a worker: its node ran low on memory" + where
	case CudaOutOfMemory:
		return "CUDA out of memory" + where
	case NcclTimeout:
		return "an NCCL collective timed out" + where + ": a rank stopped taking part"
	case NcclError:
		return "NCCL failed" + where
	case GpuError:
		return "a GPU error" + where + ": " + first
	case ImagePull:
		return "an image cannot be pulled" + where
	case DataError:
		return "the data cannot be trained on: " + first
	case PythonException:
		return "the training code raised " + Exception(c) + where + ": " + strings.TrimPrefix(strings.TrimPrefix(first, Exception(c)), ": ")
	case Preempted:
		return "the GPU nodes were taken back (preemption) more often than limits.preemptions allows"
	case Stalled:
		if first != "" && c.Rank >= 0 {
			return "training stopped advancing" + where + ", which waited outside the collective the other ranks waited in: " + first
		}
		return "training stopped advancing" + where
	case DeadlineExceeded:
		if in.Reason == runs.StartDeadlineExceeded {
			return "the attempt did not start within limits.startDeadline"
		}
		return "the run took longer than limits.deadline" + where
	case Cancelled:
		return "cancelled by a user"
	}
	if in.Message != "" {
		return "no known cause: " + in.Message
	}
	return "no known cause"
}

// hints say what to change, per cause.
var hints = map[Kind]string{
	OOMKilled:        "the container needs more memory than cluster.workers.memory (or cluster.head.memory for the head): raise it, or lower training.perDeviceBatchSize",
	HostOutOfMemory:  "the node's memory ran short of what the ranks use (data loading, the model's CPU copy): raise cluster.workers.memory or lower training.perDeviceBatchSize",
	CudaOutOfMemory:  "lower training.perDeviceBatchSize and raise training.gradientAccumulationSteps to keep the global batch, set training.gradientCheckpointing, or lower training.maxSeqLength",
	NcclTimeout:      "a rank stopped taking part in a collective (it died, hung or fell behind): look at the other ranks' logs for the first error; a retry on fresh nodes may pass",
	NcclError:        "the GPUs' network or a GPU failed under NCCL: a retry on new nodes usually passes; if it comes back, report the nodes in nodes.json",
	GpuError:         "a GPU fault (an illegal memory access, an ECC error): a retry on new nodes usually passes; if it comes back on the same code, it is a bug in a kernel",
	ImagePull:        "the image named in cluster.head.image or cluster.workers.image (or the deployment's trainer image) does not exist or the nodes may not read it: check its name and digest and the node service account's Artifact Registry reader role",
	DataError:        "fix the dataset (the line names the file, row and column); set dataset.check to find every bad row before any GPU is asked for",
	PythonException:  "the traceback's last frames show where the training code failed; a retry would fail the same way",
	Preempted:        "use a reservation or on-demand tier in cluster.capacity, or raise limits.preemptions",
	Stalled:          "raydrop diagnose shows where each rank waited (their stacks in the evidence): fix what the rank the others waited for is stuck in, raise limits.stallRestarts to restart from the last checkpoint again, or raise limits.stallAfter if a step can take that long",
	DeadlineExceeded: "raise limits.deadline (or limits.startDeadline when the attempt never started), or train fewer steps",
	Cancelled:        "",
	Unknown:          "read the evidence folder: the pods' logs and statuses, the events, each rank's Ray logs",
}
