package kubesim

import (
	"context"
	"fmt"
	"sort"
	"strings"

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
}

// workerf adds a worker's logging line, forwarded by Ray.
func (t *trainer) workerf(format string, args ...any) {
	t.logf(workerPrefix+t.started.Format("2006-01-02 15:04:05,000")+" INFO raydrop.trainer: "+format, args...)
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
	t.logf("%s{%s}", workerPrefix, strings.Join(parts, ", "))
}

// copyLog writes the driver's log beside the run, where
// trainer/driverlog.py copies it (checkpoints.DriverLogFile).
func (t *trainer) copyLog(ctx context.Context) error {
	return t.st.put(ctx, t.a.bucket, joinName(t.a.experimentName(), checkpoints.DriverLogFile), []byte(t.driverLog.String()))
}
