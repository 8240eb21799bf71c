package kubesim

import (
	"context"
	"fmt"
	"sort"
	"strings"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
)

// worker prefixes a Ray Train worker's line as Ray does when it forwards
// it to the driver's output.
const workerPrefix = "(RayTrainWorker pid=4242, ip=10.244.0.2) "

// logf adds a line to the driver's log, which the simulated job copies
// beside the run with every report and at its end, as the trainer copies
// its own (the lines are the trainer's: train.py's "raydrop: …", worker.py's
// logging, and transformers' PrinterCallback's dict of each logging step).
func (t *trainer) logf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	t.driverLog.WriteString(line + "\n")
	t.p.say(line)
	// The driver runs on the head, whose Ray log folder keeps its output
	// as job-driver-<submission ID>.log.
	if t.head == nil {
		if pods, err := t.p.d.sim.clusterPods(context.Background(), t.ns, t.cluster, rayv1.HeadNode); err == nil && len(pods) > 0 {
			t.head = &pods[0]
		}
	}
	t.p.d.sim.rayLogs.write(t.head, "job-driver-"+t.p.id+".log", line+"\n")
}

// rankOut adds lines to what rank's worker process writes to its stdout
// ("out") or stderr ("err"), in its file of the Ray log folder of the
// worker pod holding it.
func (t *trainer) rankOut(ctx context.Context, rank int, ext string, lines ...string) {
	pod, _ := t.rankWorker(ctx, rank)
	t.p.d.sim.rayLogs.write(pod, rankFile(t.p.id, t.p.rayJobID, rank, ext), strings.Join(lines, "\n")+"\n")
}

// workerf adds a worker's logging line (rank 0's, on its stderr), forwarded
// by Ray.
func (t *trainer) workerf(format string, args ...any) {
	line := fmt.Sprintf(t.started.Format("2006-01-02 15:04:05,000")+" INFO raydrop.trainer: "+format, args...)
	t.logf("%s%s", workerPrefix, line)
	t.rankOut(context.Background(), 0, "err", line)
}

// logStep adds transformers' line for a logging step.
func (t *trainer) logStep(m map[string]any) {
	var parts []string
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		if k == "step" {
			continue
		}
		if v, ok := m[k].(float64); ok {
			parts = append(parts, fmt.Sprintf("'%s': %v", k, v))
		}
	}
	line := "{" + strings.Join(parts, ", ") + "}"
	t.logf("%s%s", workerPrefix, line)
	t.rankOut(context.Background(), 0, "out", line)
}

// copyLog writes the driver's log beside the run, where
// trainer/driverlog.py copies it (checkpoints.DriverLogFile).
// The Ray pods' log sidecars copy as often (raylogs.go).
func (t *trainer) copyLog(ctx context.Context) error {
	t.p.d.sim.collectClusterRayLogs(ctx, t.ns, t.cluster)
	return t.st.put(ctx, t.a.bucket, joinName(t.a.experimentName(), checkpoints.DriverLogFile), []byte(t.driverLog.String()))
}
