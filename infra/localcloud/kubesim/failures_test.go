package kubesim_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"path"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"google.golang.org/api/iterator"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/pkg/evidence"
	"github.com/raydrop/raydrop/pkg/manifests"
)

// TestFailureModes plays each failure of a rank and looks for it where a
// person would: the driver's output (the submitter pod's log, through the
// API server), with the failing rank's prefix naming its worker pod's IP,
// and the worker pod's status for a container the OOM killer ended.
func TestFailureModes(t *testing.T) {
	t.Parallel()
	cs := clientset(t)
	for _, tc := range []struct {
		outcome kubesim.Outcome
		want    []string // in the driver's output, after the rank's prefix where ranked
		ranked  bool
		// In the Ray log folder of the rank's worker pod, as its raylogs
		// sidecar copied it: file (a glob) -> a line in it.
		rayLog map[string]string
	}{
		{kubesim.CudaOOM, []string{"torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"}, true,
			map[string]string{"worker-*-4251.err": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate"}},
		{kubesim.NcclTimeout, []string{"Watchdog caught collective operation timeout: WorkNCCL(SeqNum=", "To avoid data inconsistency, we are taking the entire process down."}, true,
			map[string]string{"worker-*-4251.err": "Watchdog caught collective operation timeout"}},
		{kubesim.HostOOM, []string{"ray.exceptions.OutOfMemoryError: Task was killed due to the node running low on memory."}, false,
			map[string]string{"raylet.out": "killed due to memory pressure (OOM)"}},
		{kubesim.OOMKilled, []string{"ray.exceptions.ActorDiedError: The actor died unexpectedly before finishing this task.", "killed by SIGKILL by OOM killer"}, false,
			map[string]string{"raylet.out": "Raylet of id"}},
	} {
		t.Run(string(tc.outcome), func(t *testing.T) {
			t.Parallel()
			cluster := "sim-" + string(tc.outcome)
			rank := 9 // of 16, on the second of two worker pods
			s, rj := startJob(t, cluster, kubesim.Scenario{Outcome: tc.outcome, At: 2, Rank: &rank})
			rayJobEnds(t, rj.Name, rayv1.JobDeploymentStatusFailed, 60*time.Second)
			var sub corev1.Pod
			waitFor(t, "the submitter pod ended", 20*time.Second, func() (bool, error) {
				sub = submitterPod(t, rj.Name)
				return sub.Status.Phase == corev1.PodFailed, nil
			})
			log := podLog(t, cs, sub.Name, "")
			workers := listPods(t, cluster, "worker")
			sort.Slice(workers, func(i, j int) bool { return workers[i].Name < workers[j].Name })
			if len(workers) != 2 {
				t.Fatalf("%d worker pods, want 2", len(workers))
			}
			prefix := fmt.Sprintf("(RayTrainWorker pid=%d, ip=%s) ", 4242+rank, workers[1].Status.PodIP)
			lines := strings.Split(log, "\n")
			for _, w := range tc.want {
				found := slices.ContainsFunc(lines, func(l string) bool {
					return strings.Contains(l, w) && (!tc.ranked || strings.HasPrefix(l, prefix))
				})
				if !found {
					t.Errorf("the driver's output has no line with %q (from %q):\n%s", w, prefix, log)
				}
			}
			// The evidence kept before a teardown holds the same lines.
			ev := captureEvidence(t, cs, cluster, rj.Name)
			kept := ev.log(t, sub.Name, sub.Spec.Containers[0].Name, false)
			for _, w := range tc.want {
				if !strings.Contains(kept, w) {
					t.Errorf("the evidence's submitter log has no %q", w)
				}
			}
			// Ray's own logs, beside the evidence: the rank's whole output on
			// its worker pod, the driver's on the head.
			folder := strings.TrimPrefix(manifests.EvidenceFolder(s, cluster+"-0001", 1), "gs://"+bucketName+"/")
			ray := rayLogsOf(t, folder, workers[1].Name)
			for glob, line := range tc.rayLog {
				if !slices.ContainsFunc(slices.Collect(maps.Keys(ray)), func(name string) bool {
					ok, _ := path.Match(glob, name)
					return ok && strings.Contains(ray[name], line)
				}) {
					t.Errorf("%s's Ray logs have no %s with %q: %v", workers[1].Name, glob, line, slices.Sorted(maps.Keys(ray)))
				}
			}
			head := listPods(t, cluster, "head")[0]
			if driver := rayLogsOf(t, folder, head.Name)["job-driver-"+rj.Spec.JobId+".log"]; !strings.Contains(driver, tc.want[0]) {
				t.Errorf("the head's Ray logs have no driver log with %q:\n%s", tc.want[0], driver)
			}
			st := workers[1].Status.ContainerStatuses[0]
			kst := ev.pod(t, workers[1].Name).Status.ContainerStatuses[0]
			if tc.outcome != kubesim.OOMKilled {
				if kst.RestartCount != 0 || kst.State.Running == nil {
					t.Errorf("evidence of worker %s: %+v, want its container running, never restarted", workers[1].Name, kst)
				}
				return
			}
			if last := st.LastTerminationState.Terminated; last == nil || last.Reason != "OOMKilled" || last.ExitCode != 137 || st.RestartCount != 1 {
				t.Errorf("worker %s: restarts %d, last state %+v; want OOMKilled, exit 137, one restart", workers[1].Name, st.RestartCount, st.LastTerminationState)
			}
			if last := kst.LastTerminationState.Terminated; last == nil || last.Reason != "OOMKilled" || last.ExitCode != 137 || kst.RestartCount != 1 {
				t.Errorf("evidence of worker %s: restarts %d, last state %+v; want OOMKilled, exit 137, one restart", workers[1].Name, kst.RestartCount, kst.LastTerminationState)
			}
			// The container the OOM killer ended, and the kubelet's back-off.
			if prev := ev.log(t, workers[1].Name, workers[1].Spec.Containers[0].Name, true); !strings.Contains(prev, "Ray runtime started.") {
				t.Errorf("evidence: the OOM-killed container's log %q, want its ray start", prev)
			}
			if !ev.hasEvent(workers[1].Name, "BackOff") {
				t.Errorf("evidence: no BackOff event of worker %s in %s", workers[1].Name, ev.files["events.json"])
			}
		})
	}
}

// rayLogsOf is what pod's raylogs sidecar copied to the evidence folder:
// file -> content, checked against its index.json.
func rayLogsOf(t *testing.T, folder, pod string) map[string]string {
	t.Helper()
	prefix := folder + "ray/" + pod + "/"
	files := map[string]string{}
	it := gcs.Bucket(bucketName).Objects(context.Background(), &storage.Query{Prefix: prefix})
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		files[strings.TrimPrefix(a.Name, prefix)] = string(readObject(t, a.Name))
	}
	var index struct {
		Logs  string `json:"logs"`
		Files map[string]struct {
			Bytes, Kept int
			Capped      bool
		} `json:"files"`
	}
	if err := json.Unmarshal([]byte(files["index.json"]), &index); err != nil {
		t.Fatalf("%sindex.json: %v (files %v)", prefix, err, slices.Sorted(maps.Keys(files)))
	}
	if index.Logs != "/tmp/ray/session_latest/logs" || len(index.Files) != len(files)-1 {
		t.Errorf("%sindex.json: %+v, for files %v", prefix, index, slices.Sorted(maps.Keys(files)))
	}
	for name, e := range index.Files {
		if len(files[name]) != e.Kept || e.Capped {
			t.Errorf("%s%s: %d bytes, index.json says %+v", prefix, name, len(files[name]), e)
		}
	}
	return files
}

// TestImagePullFails: workers whose image cannot be pulled wait in
// ErrImagePull then ImagePullBackOff with the kubelet's events, their logs
// get the kubelet's 400, and the job does not start.
func TestImagePullFails(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	cs := clientset(t)
	_, rj := startJob(t, "sim-badimage", kubesim.Scenario{Outcome: kubesim.ImagePull})
	var pod corev1.Pod
	waitFor(t, "a worker in ImagePullBackOff", 30*time.Second, func() (bool, error) {
		for _, p := range listPods(t, "sim-badimage", "worker") {
			if len(p.Status.ContainerStatuses) > 0 && p.Status.ContainerStatuses[0].State.Waiting != nil && p.Status.ContainerStatuses[0].State.Waiting.Reason == "ImagePullBackOff" {
				pod = p
				return true, nil
			}
		}
		return false, nil
	})
	_, err := cs.CoreV1().Pods("default").GetLogs(pod.Name, &corev1.PodLogOptions{}).Stream(ctx)
	if !apierrors.IsBadRequest(err) || !strings.Contains(err.Error(), "is waiting to start: trying and failing to pull image") {
		t.Errorf("logs of a worker in ImagePullBackOff: %v, want the kubelet's 400", err)
	}
	var reasons []string
	waitFor(t, "the kubelet's pull events", 10*time.Second, func() (bool, error) {
		evs := &corev1.EventList{}
		if err := k8s.List(ctx, evs, client.InNamespace("default")); err != nil {
			return false, err
		}
		reasons = reasons[:0]
		for _, e := range evs.Items {
			if e.InvolvedObject.UID == pod.UID {
				reasons = append(reasons, e.Reason+": "+e.Message)
			}
		}
		return slices.ContainsFunc(reasons, func(r string) bool {
			return strings.HasPrefix(r, "Failed: Failed to pull image") && strings.Contains(r, "not found")
		}) &&
			slices.Contains(reasons, "Failed: Error: ImagePullBackOff") && slices.ContainsFunc(reasons, func(r string) bool { return strings.HasPrefix(r, "BackOff: Back-off pulling image") }), fmt.Errorf("events %v", reasons)
	})
	// The evidence: the pull events, and the container's log missing with
	// the reason it never started.
	ev := captureEvidence(t, cs, "sim-badimage", rj.Name)
	if !ev.hasEvent(pod.Name, "Failed") || !ev.hasEvent(pod.Name, "BackOff") {
		t.Errorf("evidence: no pull events of %s in %s", pod.Name, ev.files["events.json"])
	}
	if !slices.ContainsFunc(ev.manifest.Missing, func(m evidence.Missing) bool {
		return strings.Contains(m.What, pod.Name) && strings.Contains(m.Why, "never started: ImagePullBackOff")
	}) || ev.manifest.Complete {
		t.Errorf("evidence manifest: complete %v, missing %+v; want %s's log named missing as never started (ImagePullBackOff)", ev.manifest.Complete, ev.manifest.Missing, pod.Name)
	}
	if cur, err := getRayJob(rj.Name); err != nil || cur.Status.JobStatus == rayv1.JobStatusRunning {
		t.Errorf("RayJob %s: %v, job status %q; want a job that never runs", rj.Name, err, cur.Status.JobStatus)
	}
	if err := k8s.Delete(ctx, rj); err != nil {
		t.Fatal(err)
	}
}
