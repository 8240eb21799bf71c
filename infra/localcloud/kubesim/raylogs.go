package kubesim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/raydrop/raydrop/pkg/manifests"
)

// Ray's own log folder on each Ray node, and its copy by the pod's
// raylogs sidecar.
//
// On a real node Ray writes /tmp/ray/session_latest/logs: raylet.out,
// gcs_server.out on the head, job-driver-<submission ID>.log (the driver's
// output) on the head, and worker-<worker ID>-<job ID>-<pid>.out|err, the
// whole stdout and stderr of each worker process (a rank). The pod's
// raylogs sidecar (trainer/raylogs.py --follow, manifests.RayLogsSidecar)
// copies what was written there since the head's latest job started to
// <that job's evidence folder>ray/<pod>/, every few seconds and on SIGTERM.
//
// Here each Ray pod's folder is kept in memory, written with what Ray
// would write there from what the play does (the raylet's start, each
// rank's own lines, the driver's output), and the sidecar is played:
// every second (the sidecar copies every 5 s; the simulated run is
// faster), at every report of the trainer, and when the pod is deleted
// (its SIGTERM), the changed files and index.json are written in the
// layout and the format raylogs.py writes (its tests pin them). What is simulated: the files'
// contents are the play's lines, not Ray's full logs; Ray's session folder
// does not change when a container restarts.

// The sidecar's defaults (trainer/raylogs.py); it copies every 5 s, here
// every second, as the simulated run is faster than a real one.
const (
	rayLogsCap    = 8 << 20
	rayLogsLinger = 300 * time.Second
	rayLogsFolder = "/tmp/ray/session_latest/logs"
	rayLogsEvery  = time.Second
)

type nodeFile struct {
	data []byte
	mod  time.Time
}

// nodeFolder is one Ray pod's log folder, and what its sidecar copied.
type nodeFolder struct {
	files  map[string]*nodeFile
	dest   string         // the evidence folder the sidecar copies to
	copied map[string]int // file -> its length when last copied to dest
	index  map[string]rayLogsEntry
}

// rayLogsEntry is a file's entry in index.json.
type rayLogsEntry struct {
	Bytes  int  `json:"bytes"`
	Kept   int  `json:"kept"`
	Capped bool `json:"capped"`
}

// rayNodeLogs is every Ray pod's log folder, by namespace/name.
type rayNodeLogs struct {
	mu   sync.Mutex
	pods map[string]*nodeFolder
	// copying is held through a copy, so that two never write the same
	// pod's files out of order.
	copying sync.Mutex
}

func podKey(pod *corev1.Pod) string { return pod.Namespace + "/" + pod.Name }

// write appends text to a file of pod's Ray log folder.
func (r *rayNodeLogs) write(pod *corev1.Pod, file, text string) {
	if pod == nil {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.pods == nil {
		r.pods = map[string]*nodeFolder{}
	}
	f := r.pods[podKey(pod)]
	if f == nil {
		f = &nodeFolder{files: map[string]*nodeFile{}}
		r.pods[podKey(pod)] = f
	}
	nf := f.files[file]
	if nf == nil {
		nf = &nodeFile{}
		f.files[file] = nf
	}
	nf.data = append(nf.data, text...)
	nf.mod = time.Now()
}

// forget drops a deleted pod's folder (its emptyDir goes with it).
func (r *rayNodeLogs) forget(pod *corev1.Pod) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.pods, podKey(pod))
}

// rayletStart is what a Ray node's raylet writes first to raylet.out.
func rayletStart(pod *corev1.Pod, ip string, now time.Time) string {
	ts := rayTime(now)
	node := sha256.Sum224([]byte(pod.UID))
	return fmt.Sprintf("[%s I 184 184] (raylet) main.cc:227: Setting cluster ID to: 1b1d5e0e4c574b359b6c7a2f0d3e9c11a1b2c3d4e5f6a7b8c9d0e1f2\n"+
		"[%s I 184 184] (raylet) main.cc:322: Raylet is not set to kill unknown children.\n"+
		"[%s I 184 184] (raylet) node_manager.cc:431: Initializing NodeManager node_id=%s\n"+
		"[%s I 184 184] (raylet) raylet.cc:133: Raylet of id, %s started. Raylet consists of node_manager and object_manager. node_manager address: %s:42229\n",
		ts, ts, ts, hex.EncodeToString(node[:]), ts, hex.EncodeToString(node[:]), ip)
}

// gcsStart is what the head's GCS server writes first to gcs_server.out.
func gcsStart(now time.Time) string {
	ts := rayTime(now)
	return fmt.Sprintf("[%s I 120 120] (gcs_server) gcs_server_main.cc:74: Ray cluster metadata ray_version=2.48.0 ray_commit=\n"+
		"[%s I 120 120] (gcs_server) gcs_server.cc:303: Gcs Server started at port 6379\n", ts, ts)
}

// memoryMonitorKill is what the raylet of a node whose memory monitor
// killed a worker writes to raylet.out (src/ray/raylet/node_manager.cc,
// the OOM kill summary logged with the time period's kills).
func memoryMonitorKill(rank int, ip string, now time.Time) string {
	ts := rayTime(now)
	return fmt.Sprintf("[%s E 184 184] (raylet) node_manager.cc:3069: 1 Workers (tasks / actors) killed due to memory pressure (OOM), 0 Workers crashed due to other reasons at node (ID: 3f6c2a9e0d5b4c1e8a7f9b2d6e4c0a1f3b5d7e9c2a4f6b8d0e1c3a5f, IP: %s) over the last time period. "+
		"To see more information about the Workers killed on this node, use `ray logs raylet.out -ip %s`\n"+
		"[%s I 184 184] (raylet) worker_killing_policy.cc:101: Killing worker with pid %d: the most recently scheduled task (RayTrainWorker)\n", ts, ip, ip, ts, 4242+rank)
}

// ranksStarted writes what the Ray log folders get when Ray Train starts
// its workers: each worker pod's raylet starting a worker process per rank
// it holds, and each rank's first line, Ray Train's process group set-up
// (ray/train/torch/config.py).
func (t *trainer) ranksStarted(ctx context.Context) {
	now := time.Now()
	master, _ := t.rankWorker(ctx, 0)
	addr := "10.244.0.2"
	if master != nil {
		addr = master.Status.PodIP
	}
	for rank := range t.a.numWorkers {
		pod, _ := t.rankWorker(ctx, rank)
		ts := rayTime(now)
		t.p.d.sim.rayLogs.write(pod, "raylet.out", fmt.Sprintf("[%s I 184 184] (raylet) worker_pool.cc:527: Started worker process with pid %d, the token is %d\n", ts, 4242+rank, rank))
		t.rankOut(ctx, rank, "err", strings.TrimSuffix(rayLines(now, fmt.Sprintf("INFO config.py:83 -- Setting up process group for: env://%s:29500 [rank=%d, world_size=%d]", addr, rank, t.a.numWorkers)), "\n"))
	}
}

// rankFile is the name Ray gives a worker process's log file:
// worker-<worker ID>-<job ID>-<pid>.<ext>.
func rankFile(submissionID, rayJobID string, rank int, ext string) string {
	id := sha256.Sum224(fmt.Appendf(nil, "%s/%d", submissionID, rank))
	return fmt.Sprintf("worker-%s-%s-%d.%s", hex.EncodeToString(id[:]), rayJobID, 4242+rank, ext)
}

// hasRayLogsSidecar reports whether pod runs the raylogs sidecar.
func hasRayLogsSidecar(pod *corev1.Pod) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == manifests.RayLogsContainer {
			return true
		}
	}
	return false
}

// evidenceOf is the evidence folder a RayJob names in its runtime env
// (manifests.EvidenceEnv), or "".
func evidenceOf(rj *rayv1.RayJob) string {
	var env struct {
		EnvVars map[string]string `json:"env_vars"`
	}
	if yaml.Unmarshal([]byte(rj.Spec.RuntimeEnvYAML), &env) != nil {
		return ""
	}
	if f := env.EnvVars[manifests.EvidenceEnv]; strings.HasPrefix(f, "gs://") {
		return f
	}
	return ""
}

// latest is the play the head of cluster started last, as the sidecar's
// GET /api/jobs/ finds it.
func (d *dashboard) latest(cluster string) *play {
	d.mu.Lock()
	ps := append([]*play(nil), d.order...)
	d.mu.Unlock()
	var last *play
	var at time.Time
	for _, p := range ps {
		r := p.snapshot()
		if r.Cluster == cluster && !r.Submitted.Before(at) {
			last, at = p, r.Submitted
		}
	}
	return last
}

// collectRayLogs plays pod's raylogs sidecar copying its node's Ray logs:
// the files written since the cluster's latest job started, those that
// changed since the last copy, each kept by its last rayLogsCap bytes,
// then index.json; nothing for a job that names no evidence folder, or
// ended more than rayLogsLinger ago.
func (s *Sim) collectRayLogs(ctx context.Context, pod *corev1.Pod) error {
	if s.dash == nil || !hasRayLogsSidecar(pod) {
		return nil
	}
	s.rayLogs.copying.Lock()
	defer s.rayLogs.copying.Unlock()
	p := s.dash.latest(pod.Labels[utils.RayClusterLabelKey])
	if p == nil {
		return nil
	}
	r := p.snapshot()
	if r.Evidence == "" || (!r.Ended.IsZero() && time.Since(r.Ended) > rayLogsLinger) {
		return nil
	}
	bucket, prefix, ok := splitGS(r.Evidence)
	if !ok {
		return nil
	}
	dest := joinName(prefix, "ray", pod.Name)

	type put struct {
		name string
		data []byte
	}
	var puts []put
	s.rayLogs.mu.Lock()
	f := s.rayLogs.pods[podKey(pod)]
	if f != nil {
		if f.dest != dest {
			f.dest, f.copied, f.index = dest, map[string]int{}, map[string]rayLogsEntry{}
		}
		names := make([]string, 0, len(f.files))
		for n := range f.files {
			names = append(names, n)
		}
		sort.Strings(names)
		for _, n := range names {
			nf := f.files[n]
			if nf.mod.Before(r.Submitted) || f.copied[n] == len(nf.data) {
				continue
			}
			data := nf.data[max(0, len(nf.data)-rayLogsCap):]
			puts = append(puts, put{joinName(dest, n), append([]byte(nil), data...)})
			f.copied[n] = len(nf.data)
			f.index[n] = rayLogsEntry{Bytes: len(nf.data), Kept: len(data), Capped: len(data) < len(nf.data)}
		}
		if len(puts) > 0 {
			puts = append(puts, put{joinName(dest, "index.json"), mustJSONIndent(map[string]any{
				"logs": rayLogsFolder, "cap": rayLogsCap, "copiedAt": unixSeconds(time.Now()), "files": f.index,
			})})
		}
	}
	s.rayLogs.mu.Unlock()

	st := newStore(s.o.Storage, s.o.Project)
	for _, w := range puts {
		if err := st.put(ctx, bucket, w.name, w.data); err != nil {
			// As the sidecar does: reported, tried again at the next copy.
			s.rayLogs.mu.Lock()
			if f := s.rayLogs.pods[podKey(pod)]; f != nil && f.copied != nil {
				delete(f.copied, strings.TrimPrefix(w.name, dest+"/"))
			}
			s.rayLogs.mu.Unlock()
			return fmt.Errorf("raylogs sidecar of %s: copy %s: %w", pod.Name, w.name, err)
		}
	}
	return nil
}

// collectClusterRayLogs plays the sidecars of every Ray pod of a cluster.
func (s *Sim) collectClusterRayLogs(ctx context.Context, ns, cluster string) {
	pods := &corev1.PodList{}
	if err := s.Client.List(ctx, pods, client.InNamespace(ns), client.MatchingLabels{utils.RayClusterLabelKey: cluster}); err != nil {
		return
	}
	s.collectPods(ctx, pods.Items)
}

// collectPods plays the sidecars of the running Ray pods among pods.
func (s *Sim) collectPods(ctx context.Context, pods []corev1.Pod) {
	for i := range pods {
		if pods[i].Status.Phase != corev1.PodRunning || !isRayNode(&pods[i]) {
			continue
		}
		if err := s.collectRayLogs(ctx, &pods[i]); err != nil && ctx.Err() == nil {
			s.log.Warn("kubesim: Ray log copy", "err", err)
		}
	}
}

// copyRayLogsEvery plays every Ray pod's sidecar every period until ctx
// ends.
func (s *Sim) copyRayLogsEvery(ctx context.Context, period time.Duration) {
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		pods := &corev1.PodList{}
		if err := s.Client.List(ctx, pods, client.HasLabels{utils.RayNodeTypeLabelKey}); err != nil {
			continue
		}
		s.collectPods(ctx, pods.Items)
	}
}

func mustJSONIndent(v any) []byte {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		panic(err)
	}
	return b
}
