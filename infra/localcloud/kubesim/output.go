package kubesim

import (
	"fmt"
	"strings"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
)

// What the containers of a Ray cluster write to their own output, which
// the kubelet keeps (containerlogs.go) and `kubectl logs` reads. A Ray
// node's container runs `ray start ... --block`, which prints its start-up
// and then only what goes wrong with Ray's own processes: a Ray worker
// process's output (the training loop's) goes to its node's
// /tmp/ray/session_latest/logs/worker-*.out|err and, forwarded by Ray, to
// the driver. The submitter's container runs `ray job submit`, which
// prints the submission and then tails the driver's output until the job
// ends.
//
// The lines are Ray's cli_logger's without a terminal (non-interactive:
// "<time>\t<LEVEL> <file>:<line> -- <text>"), as KubeRay's documentation
// and users' reports show them; the file:line numbers are those of the
// Ray version the cited sample ran where it shows the line (the lines
// before a sample's first are numbered in their order), not Ray 2.48's.

// rayTime is cli_logger's time stamp.
func rayTime(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05,000") }

// rayLines stamps cli_logger lines: each "LEVEL file:line -- text".
func rayLines(t time.Time, lines ...string) string {
	var b strings.Builder
	for _, l := range lines {
		b.WriteString(rayTime(t) + "\t" + l + "\n")
	}
	return b.String()
}

// rayStartOutput is what a Ray node's container prints when `ray start
// --block` has started the node (ip is the pod's IP). The head's text
// follows a KubeRay head's log of 2024
// (https://github.com/ray-project/kuberay, "Next steps … --block"), the
// worker's a `ray start --address` worker's of Ray 2.x reported in
// vllm-project/vllm#13367.
func rayStartOutput(pod *corev1.Pod, ip string, now time.Time) string {
	if pod.Labels[utils.RayNodeTypeLabelKey] == string(rayv1.HeadNode) {
		return rayLines(now,
			"INFO usage_lib.py:467 -- Usage stats collection is enabled by default without user confirmation because this terminal is detected to be non-interactive. To disable this, add `--disable-usage-stats` to the command that starts the cluster, or run the following command: `ray disable-usage-stats` before starting the cluster. See https://docs.ray.io/en/master/cluster/usage-stats.html for more details.",
			"INFO scripts.py:749 -- Local node IP: "+ip,
			"SUCC scripts.py:786 -- --------------------",
			"SUCC scripts.py:787 -- Ray runtime started.",
			"SUCC scripts.py:788 -- --------------------",
			"INFO scripts.py:790 -- Next steps",
			"INFO scripts.py:793 -- To add another node to this Ray cluster, run",
			"INFO scripts.py:796 --   ray start --address='"+ip+":6379'",
			"INFO scripts.py:801 -- To connect to this Ray cluster:",
			"INFO scripts.py:803 -- import ray",
			"INFO scripts.py:804 -- ray.init()",
			"INFO scripts.py:815 -- To submit a Ray job using the Ray Jobs CLI:",
			"INFO scripts.py:816 --   RAY_ADDRESS='http://"+ip+":8265' ray job submit --working-dir . -- python my_script.py",
			"INFO scripts.py:825 -- See https://docs.ray.io/en/latest/cluster/running-applications/job-submission/index.html",
			"INFO scripts.py:829 -- for more information on submitting Ray jobs to the Ray cluster.",
			"INFO scripts.py:834 -- To terminate the Ray runtime, run",
			"INFO scripts.py:835 --   ray stop",
			"INFO scripts.py:838 -- To view the status of the cluster, use",
			"INFO scripts.py:839 --   ray status",
			"INFO scripts.py:843 -- To monitor and debug Ray, view the dashboard at",
			"INFO scripts.py:844 --   "+ip+":8265",
			"INFO scripts.py:851 -- If connection to the dashboard fails, check your firewall settings and network configuration.",
			"INFO scripts.py:952 -- --block",
			"INFO scripts.py:953 -- This command will now block forever until terminated by a signal.",
			"INFO scripts.py:956 -- Running subprocesses are monitored and a message will be printed if any of them terminate unexpectedly. Subprocesses exit with SIGTERM will be treated as graceful, thus NOT reported.",
		)
	}
	return rayLines(now,
		"INFO scripts.py:1047 -- Local node IP: "+ip,
		"SUCC scripts.py:1063 -- --------------------",
		"SUCC scripts.py:1064 -- Ray runtime started.",
		"SUCC scripts.py:1065 -- --------------------",
		"INFO scripts.py:1067 -- To terminate the Ray runtime, run",
		"INFO scripts.py:1068 --   ray stop",
		"INFO scripts.py:1076 -- --block",
		"INFO scripts.py:1077 -- This command will now block forever until terminated by a signal.",
		"INFO scripts.py:1080 -- Running subprocesses are monitored and a message will be printed if any of them terminate unexpectedly. Subprocesses exit with SIGTERM will be treated as graceful, thus NOT reported.",
	)
}

// isRayNode reports whether a pod is a Ray head or worker, whose container
// runs `ray start`.
func isRayNode(pod *corev1.Pod) bool {
	t := pod.Labels[utils.RayNodeTypeLabelKey]
	return t == string(rayv1.HeadNode) || t == string(rayv1.WorkerNode)
}

// submitHeader is what `ray job submit` prints before it tails the job's
// logs (ray/dashboard/modules/job/cli.py, submit; the shape of the
// submitter log in KubeRay's RayJob quick start).
func submitHeader(address, id string, now time.Time) string {
	ok := fmt.Sprintf("Job '%s' submitted successfully", id)
	return rayLines(now,
		"INFO cli.py:39 -- Job submission server address: "+address,
		"SUCC cli.py:63 -- "+strings.Repeat("-", len(ok)),
		"SUCC cli.py:64 -- "+ok,
		"SUCC cli.py:65 -- "+strings.Repeat("-", len(ok)),
		"INFO cli.py:352 -- Next steps",
		"INFO cli.py:353 -- Query the logs of the job:",
		"INFO cli.py:355 -- ray job logs "+id,
		"INFO cli.py:357 -- Query the status of the job:",
		"INFO cli.py:359 -- ray job status "+id,
		"INFO cli.py:361 -- Request the job to be stopped:",
		"INFO cli.py:363 -- ray job stop "+id,
		"INFO cli.py:373 -- Tailing logs until the job exits (disable with --no-wait):",
	)
}

// submitFooter is what `ray job submit` prints once the job has ended
// (cli.py, _log_job_status): a success box, a warning for a stopped job,
// an error box and the status message for a failed one.
func submitFooter(id string, st rayv1.JobStatus, message string, now time.Time) string {
	switch st {
	case rayv1.JobStatusSucceeded:
		msg := fmt.Sprintf("Job '%s' succeeded", id)
		return rayLines(now, "SUCC cli.py:63 -- "+strings.Repeat("-", len(msg)), "SUCC cli.py:64 -- "+msg, "SUCC cli.py:65 -- "+strings.Repeat("-", len(msg)))
	case rayv1.JobStatusStopped:
		return rayLines(now, fmt.Sprintf("WARN cli.py:287 -- Job '%s' was stopped", id))
	case rayv1.JobStatusFailed:
		msg := fmt.Sprintf("Job '%s' failed", id)
		return rayLines(now, "ERR cli.py:71 -- "+strings.Repeat("-", len(msg)), "ERR cli.py:72 -- "+msg, "ERR cli.py:73 -- "+strings.Repeat("-", len(msg))) +
			"Status message: " + message + "\n"
	}
	return ""
}
