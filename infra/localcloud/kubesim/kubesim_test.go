package kubesim_test

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	"google.golang.org/api/iterator"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/manifests"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/schemas"
)

var (
	sim       *kubesim.Sim
	gcs       *storage.Client
	k8s       client.Client // uncached
	scenarios sync.Map      // RayJob name -> kubesim.Scenario
	code      manifests.Code
)

const bucketName = "my-project-raydrop-checkpoints" // examples/gemma3-vision.json

func TestMain(m *testing.M) {
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		fmt.Fprintln(os.Stderr, "kubesim tests need etcd and kube-apiserver: set KUBEBUILDER_ASSETS to their folder (make tools builds them into RAYDROP_CACHE; make test sets it)")
		os.Exit(1)
	}
	flag.Parse()
	os.Exit(run(m))
}

func run(m *testing.M) int {
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{
		Scheme: "http", Host: "127.0.0.1", Port: 0, Writer: io.Discard,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake-gcs-server:", err)
		return 1
	}
	defer srv.Stop()
	gcs = srv.Client()

	level := slog.LevelWarn
	if testing.Verbose() {
		level = slog.LevelInfo
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	ctx := context.Background()
	t0 := time.Now()
	sim, err = kubesim.Start(ctx, kubesim.Options{
		Storage: gcs,
		Log:     log,
		Scenario: func(_ context.Context, job *rayv1.RayJob) kubesim.Scenario {
			if sc, ok := scenarios.Load(job.Name); ok {
				return sc.(kubesim.Scenario)
			}
			return kubesim.DefaultScenario()
		},
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "kubesim started in %v\n", time.Since(t0).Round(time.Millisecond))
	defer func() {
		t1 := time.Now()
		if err := sim.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stop:", err)
		}
		fmt.Fprintf(os.Stderr, "kubesim stopped in %v\n", time.Since(t1).Round(time.Millisecond))
	}()
	if k8s, err = client.New(sim.Config, client.Options{Scheme: kubesim.Scheme()}); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	if code, err = manifests.TrainerCode(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

// exampleSpec is examples/gemma3-vision.json on its own cluster, trained
// for two epochs.
func exampleSpec(t *testing.T, cluster string) *spec.JobSpec {
	t.Helper()
	data, err := os.ReadFile("../../../examples/gemma3-vision.json")
	if err != nil {
		t.Fatal(err)
	}
	s, err := spec.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	s.Cluster.Name = cluster
	s.Training.Epochs = 2
	s.Cluster.Head.CPU, s.Cluster.Head.Memory = "1", "1Gi"
	s.Cluster.Workers.CPU, s.Cluster.Workers.Memory, s.Cluster.Workers.GPUs = "1", "1Gi", 1
	return s
}

// createCluster creates the trainer ConfigMap and the RayCluster.
func createCluster(t *testing.T, s *spec.JobSpec) *rayv1.RayCluster {
	t.Helper()
	ctx := context.Background()
	if err := k8s.Create(ctx, manifests.TrainerConfigMap(s, code)); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	rc := manifests.RayCluster(s, code, 0)
	if err := k8s.Create(ctx, rc); err != nil {
		t.Fatal(err)
	}
	return rc
}

func submit(t *testing.T, s *spec.JobSpec, run manifests.Run, sc kubesim.Scenario) *rayv1.RayJob {
	t.Helper()
	if err := run.Validate(); err != nil {
		t.Fatal(err)
	}
	rj := manifests.RayJob(s, run)
	scenarios.Store(rj.Name, sc)
	if err := k8s.Create(context.Background(), rj); err != nil {
		t.Fatal(err)
	}
	return rj
}

// waitFor polls cond until it holds or the deadline passes.
func waitFor(t *testing.T, what string, limit time.Duration, cond func() (bool, error)) time.Duration {
	t.Helper()
	start := time.Now()
	var last error
	for time.Since(start) < limit {
		ok, err := cond()
		if ok {
			t.Logf("%s after %v", what, time.Since(start).Round(time.Millisecond))
			return time.Since(start)
		}
		last = err
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("%s: not within %v (last error: %v)", what, limit, last)
	return 0
}

func getRayJob(name string) (*rayv1.RayJob, error) {
	rj := &rayv1.RayJob{}
	return rj, k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: name}, rj)
}

func rayJobEnds(t *testing.T, name string, dep rayv1.JobDeploymentStatus, limit time.Duration) *rayv1.RayJob {
	t.Helper()
	var rj *rayv1.RayJob
	waitFor(t, "RayJob "+name+" "+string(dep), limit, func() (bool, error) {
		var err error
		rj, err = getRayJob(name)
		return err == nil && (rj.Status.JobDeploymentStatus == dep ||
			rj.Status.JobDeploymentStatus == rayv1.JobDeploymentStatusComplete ||
			rj.Status.JobDeploymentStatus == rayv1.JobDeploymentStatusFailed), err
	})
	if rj.Status.JobDeploymentStatus != dep {
		t.Fatalf("RayJob %s ended %s (%s: %s), want %s", name, rj.Status.JobDeploymentStatus, rj.Status.Reason, rj.Status.Message, dep)
	}
	return rj
}

func record(t *testing.T, submissionID string) kubesim.JobRecord {
	t.Helper()
	for _, r := range sim.Played() {
		if r.SubmissionID == submissionID {
			return r
		}
	}
	t.Fatalf("no Ray job %s was played", submissionID)
	return kubesim.JobRecord{}
}

func discover(t *testing.T, s *spec.JobSpec, run manifests.Run) *checkpoints.Result {
	t.Helper()
	_, prefix, _ := strings.Cut(strings.TrimPrefix(manifests.StoragePath(s, run.ID), "gs://"), "/")
	store := gcsStore{gcs.Bucket(bucketName), bucketName}
	exp := prefix + "/" + manifests.ExperimentName(run.Attempt)
	res, err := checkpoints.Discover(context.Background(), store, exp)
	if err != nil {
		t.Fatal(err)
	}
	// The simulated trainer's mark is the real trainer's: the schema both
	// are checked against.
	if b, err := store.Read(context.Background(), exp+"/"+checkpoints.MarkFile, 1<<20); err == nil {
		if err := schemas.ValidateMark(b); err != nil {
			t.Errorf("the simulated trainer's mark breaks schemas/mark.v1.json: %v", err)
		}
	} else if !errors.Is(err, checkpoints.ErrNotFound) {
		t.Fatal(err)
	}
	return res
}

func listPods(t *testing.T, cluster, nodeType string) []corev1.Pod {
	t.Helper()
	pods := &corev1.PodList{}
	if err := k8s.List(context.Background(), pods, client.InNamespace("default"), client.MatchingLabels{
		utils.RayClusterLabelKey: cluster, utils.RayNodeTypeLabelKey: nodeType,
	}); err != nil {
		t.Fatal(err)
	}
	return pods.Items
}

func TestSucceed(t *testing.T) {
	t.Parallel()
	s := exampleSpec(t, "sim-ok")
	createCluster(t, s)
	run := manifests.Run{ID: "sim-ok-0001", Attempt: 1, SpecHash: s.Hash()}
	start := time.Now()
	rj := submit(t, s, run, kubesim.DefaultScenario())
	rj = rayJobEnds(t, rj.Name, rayv1.JobDeploymentStatusComplete, 40*time.Second)
	if rj.Status.JobStatus != rayv1.JobStatusSucceeded {
		t.Errorf("jobStatus %s, want SUCCEEDED", rj.Status.JobStatus)
	}
	t.Logf("RayJob Complete/SUCCEEDED %v after create", time.Since(start).Round(time.Millisecond))

	res := discover(t, s, run)
	if res.Mark == nil || res.Mark.Status != "succeeded" {
		t.Fatalf("mark %+v, want status succeeded", res.Mark)
	}
	if len(res.Checkpoints) != 2 || len(res.Incomplete) != 0 {
		t.Fatalf("checkpoints %+v incomplete %v, want 2 complete (one per epoch)", res.Checkpoints, res.Incomplete)
	}
	for i, c := range res.Checkpoints {
		if want := fmt.Sprintf("checkpoint_%06d", i); c.Name != want || c.Step != int64(4*(i+1)) || c.Epoch != float64(i+1) || !c.Complete {
			t.Errorf("checkpoint %d = %+v, want %s at step %d epoch %d", i, c, want, 4*(i+1), i+1)
		}
	}
	if res.Reports != 9 { // 8 steps + the end-of-training report
		t.Errorf("reports %d, want 9", res.Reports)
	}
	if res.Checkpoints[1].Metrics["loss"] >= res.Checkpoints[0].Metrics["loss"] {
		t.Errorf("loss did not fall: %v then %v", res.Checkpoints[0].Metrics["loss"], res.Checkpoints[1].Metrics["loss"])
	}
	for _, k := range []string{"train_loss", "train_runtime", "train_tokens", "tokens_per_second", "global_step", "epoch"} {
		if _, ok := res.FinalMetrics[k]; !ok {
			t.Errorf("final metrics lack %s: %v", k, res.FinalMetrics)
		}
	}
	if res.FinalMetrics["global_step"] != 8 {
		t.Errorf("global_step %v, want 8", res.FinalMetrics["global_step"])
	}
	r := record(t, rj.Spec.JobId)
	if r.Status != rayv1.JobStatusSucceeded || r.LastStep != 8 || len(r.Checkpoints) != 2 || r.Cluster != "sim-ok" {
		t.Errorf("record %+v", r)
	}
	for _, name := range []string{".validate_storage_marker", "experiment_state-", checkpoints.DriverLogFile} {
		if !objectExists(t, res, name) {
			t.Errorf("no %s object in the experiment folder", name)
		}
	}
}

func objectExists(t *testing.T, res *checkpoints.Result, base string) bool {
	t.Helper()
	trial := strings.TrimPrefix(res.Trial, "gs://"+bucketName+"/")
	exp := trial[:strings.LastIndex(trial, "/")]
	it := gcs.Bucket(bucketName).Objects(context.Background(), &storage.Query{Prefix: exp + "/" + base})
	_, err := it.Next()
	return err == nil
}

// TestFailThenResume: attempt 1 raises at step 6 (after the first epoch's
// checkpoint); attempt 2 resumes from that checkpoint and continues the
// step count in its own experiment folder.
func TestFailThenResume(t *testing.T) {
	t.Parallel()
	s := exampleSpec(t, "sim-fail")
	createCluster(t, s)
	run1 := manifests.Run{ID: "sim-fail-0001", Attempt: 1, SpecHash: s.Hash()}
	sc := kubesim.DefaultScenario()
	sc.Outcome, sc.At = kubesim.Fail, 6
	rj := submit(t, s, run1, sc)
	rj = rayJobEnds(t, rj.Name, rayv1.JobDeploymentStatusFailed, 40*time.Second)
	if rj.Status.JobStatus != rayv1.JobStatusFailed || rj.Status.Reason != rayv1.AppFailed ||
		!strings.Contains(rj.Status.Message, "Job entrypoint command failed with exit code 1") {
		t.Errorf("RayJob status %s/%s %q, want FAILED/AppFailed", rj.Status.JobStatus, rj.Status.Reason, rj.Status.Message)
	}
	res := discover(t, s, run1)
	if res.Mark == nil || res.Mark.Status != "failed" || !strings.HasPrefix(res.Mark.Error, "RuntimeError: ") {
		t.Fatalf("mark %+v, want status failed with a RuntimeError", res.Mark)
	}
	if res.Reports != 5 || len(res.Checkpoints) != 1 || res.Latest == nil || res.Latest.Step != 4 {
		t.Fatalf("attempt 1: reports %d checkpoints %+v, want 5 reports and checkpoint_000000 at step 4", res.Reports, res.Checkpoints)
	}
	if r := record(t, rj.Spec.JobId); r.Status != rayv1.JobStatusFailed || r.LastStep != 5 || r.Error == "" {
		t.Errorf("record %+v", r)
	}

	run2 := manifests.Run{ID: run1.ID, Attempt: 2, ResumeFrom: res.Latest.URI, SpecHash: s.Hash()}
	rj2 := submit(t, s, run2, kubesim.DefaultScenario())
	rj2 = rayJobEnds(t, rj2.Name, rayv1.JobDeploymentStatusComplete, 40*time.Second)
	res2 := discover(t, s, run2)
	if res2.Mark == nil || res2.Mark.Status != "succeeded" {
		t.Fatalf("attempt 2 mark %+v", res2.Mark)
	}
	if len(res2.Checkpoints) != 1 || res2.Checkpoints[0].Name != "checkpoint_000000" || res2.Checkpoints[0].Step != 8 {
		t.Fatalf("attempt 2 checkpoints %+v, want checkpoint_000000 at step 8", res2.Checkpoints)
	}
	if res2.Reports != 5 || res2.FinalMetrics["global_step"] != 8 || res2.FinalMetrics["train_steps"] != 4 {
		t.Errorf("attempt 2: reports %d final %v, want 5 reports (steps 5-8 + end), global_step 8, train_steps 4", res2.Reports, res2.FinalMetrics)
	}
	r := record(t, rj2.Spec.JobId)
	if r.ResumedFrom != 4 || r.LastStep != 8 || r.Args["resume-from"] != res.Latest.URI {
		t.Errorf("attempt 2 record %+v", r)
	}
	// The resumed trainer state carries the history of both attempts.
	b := readObject(t, strings.TrimPrefix(res2.Checkpoints[0].URI, "gs://"+bucketName+"/")+"/trainer_state.json")
	if !strings.Contains(string(b), `"global_step": 8`) || strings.Count(string(b), `"step":`) != 8 {
		t.Errorf("trainer_state.json of attempt 2:\n%s", b)
	}
}

func readObject(t *testing.T, name string) []byte {
	t.Helper()
	r, err := gcs.Bucket(bucketName).Object(name).NewReader(context.Background())
	if err != nil {
		t.Fatal(name, err)
	}
	defer func() { _ = r.Close() }()
	b, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestLoseHead(t *testing.T) {
	t.Parallel()
	s := exampleSpec(t, "sim-lost")
	createCluster(t, s)
	run := manifests.Run{ID: "sim-lost-0001", Attempt: 1, SpecHash: s.Hash()}
	sc := kubesim.DefaultScenario()
	sc.Outcome, sc.At = kubesim.LoseHead, 3
	rj := submit(t, s, run, sc)
	var lostAt time.Time
	waitFor(t, "head lost", 40*time.Second, func() (bool, error) {
		for _, r := range sim.Played() {
			if r.SubmissionID == rj.Spec.JobId && r.Status == kubesim.JobStatusLost {
				lostAt = r.Ended
				return true, nil
			}
		}
		return false, nil
	})
	r := record(t, rj.Spec.JobId)
	rj = rayJobEnds(t, rj.Name, rayv1.JobDeploymentStatusFailed, 20*time.Second)
	t.Logf("RayJob Failed %v after the head was lost: %s %q (jobStatus %s)", time.Since(lostAt).Round(time.Millisecond), rj.Status.Reason, rj.Status.Message, rj.Status.JobStatus)
	if rj.Status.Reason != rayv1.AppFailed || rj.Status.Message != "Submitter completed but Ray job not found in RayCluster." {
		t.Errorf("RayJob status %s %q", rj.Status.Reason, rj.Status.Message)
	}
	if r.HeadPod == "" || r.LastStep != 2 {
		t.Fatalf("record %+v, want a deleted head pod and last step 2", r)
	}
	waitFor(t, "a new head pod", 20*time.Second, func() (bool, error) {
		heads := listPods(t, "sim-lost", "head")
		return len(heads) == 1 && heads[0].Name != r.HeadPod && heads[0].Status.Phase == corev1.PodRunning, nil
	})
	res := discover(t, s, run)
	if res.Mark != nil {
		t.Errorf("a lost head left a mark: %+v", res.Mark)
	}
	if res.Reports != 2 {
		t.Errorf("reports %d, want 2", res.Reports)
	}
}

func TestHangThenDelete(t *testing.T) {
	t.Parallel()
	s := exampleSpec(t, "sim-hang")
	createCluster(t, s)
	run := manifests.Run{ID: "sim-hang-0001", Attempt: 1, SpecHash: s.Hash()}
	sc := kubesim.DefaultScenario()
	sc.Outcome, sc.At = kubesim.Hang, 2
	rj := submit(t, s, run, sc)
	waitFor(t, "RayJob Running/RUNNING and the job stuck at step 1", 40*time.Second, func() (bool, error) {
		cur, err := getRayJob(rj.Name)
		if err != nil || cur.Status.JobStatus != rayv1.JobStatusRunning || cur.Status.JobDeploymentStatus != rayv1.JobDeploymentStatusRunning {
			return false, err
		}
		return record(t, rj.Spec.JobId).LastStep == 1, nil
	})
	// The ranks' heartbeat threads go on beating, with the step they hung
	// after: what the monitor's stall detection reads.
	_, exp, _ := strings.Cut(strings.TrimPrefix(record(t, rj.Spec.JobId).Experiment, "gs://"), "/")
	beat := func() checkpoints.Beat {
		var b checkpoints.Beat
		if err := json.Unmarshal(readObject(t, checkpoints.HeartbeatName(exp, 0)), &b); err != nil {
			t.Fatal(err)
		}
		return b
	}
	first := beat()
	waitFor(t, "a later heartbeat of the hung rank", 10*time.Second, func() (bool, error) { return beat().At > first.At, nil })
	if b := beat(); b.Step != 1 || b.FirstStepAt == nil || b.StepAt == nil || b.Activity != "training" {
		t.Errorf("heartbeat %+v, want step 1 still, training", b)
	}
	cur, err := getRayJob(rj.Name)
	if err != nil {
		t.Fatal(err)
	}
	if err := k8s.Delete(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "RayJob gone", 20*time.Second, func() (bool, error) {
		_, err := getRayJob(rj.Name)
		return apierrors.IsNotFound(err), nil
	})
	// The stop is recorded as it is asked; the job's status follows when
	// its run has ended.
	var r kubesim.JobRecord
	waitFor(t, "the job stopped", 10*time.Second, func() (bool, error) {
		r = record(t, rj.Spec.JobId)
		return r.Status == rayv1.JobStatusStopped, nil
	})
	if r.StopCalls == 0 || r.Status != rayv1.JobStatusStopped || r.LastStep != 1 {
		t.Errorf("record %+v, want stopped at step 1", r)
	}
	waitFor(t, "submitter Job garbage collected", 10*time.Second, func() (bool, error) {
		err := k8s.Get(context.Background(), types.NamespacedName{Namespace: "default", Name: rj.Name}, &batchv1.Job{})
		return apierrors.IsNotFound(err), nil
	})
	if m := discover(t, s, run).Mark; m != nil {
		t.Errorf("a stopped job left a mark: %+v", m)
	}
}

func TestScaleToZero(t *testing.T) {
	t.Parallel()
	s := exampleSpec(t, "sim-scale")
	rc := createCluster(t, s)
	waitFor(t, "RayCluster ready with 2 workers", 30*time.Second, func() (bool, error) {
		cur := &rayv1.RayCluster{}
		err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), cur)
		return err == nil && meta.IsStatusConditionTrue(cur.Status.Conditions, string(rayv1.RayClusterProvisioned)) && len(listPods(t, "sim-scale", "worker")) == 2, err
	})
	cur := &rayv1.RayCluster{}
	if err := k8s.Get(context.Background(), client.ObjectKeyFromObject(rc), cur); err != nil {
		t.Fatal(err)
	}
	patch := client.MergeFrom(cur.DeepCopy())
	cur.Spec.WorkerGroupSpecs[0].Replicas = ptr.To[int32](0)
	cur.Spec.WorkerGroupSpecs[0].MinReplicas = ptr.To[int32](0)
	if err := k8s.Patch(context.Background(), cur, patch); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "worker pods gone", 20*time.Second, func() (bool, error) {
		return len(listPods(t, "sim-scale", "worker")) == 0, nil
	})
	if heads := listPods(t, "sim-scale", "head"); len(heads) != 1 {
		t.Errorf("%d head pods, want 1", len(heads))
	}

	// Deleting the RayCluster takes its pods and services with it.
	if err := k8s.Delete(context.Background(), cur); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "head pod and services garbage collected", 20*time.Second, func() (bool, error) {
		svcs := &corev1.ServiceList{}
		err := k8s.List(context.Background(), svcs, client.InNamespace("default"), client.MatchingLabels{utils.RayClusterLabelKey: "sim-scale"})
		return err == nil && len(svcs.Items) == 0 && len(listPods(t, "sim-scale", "head")) == 0, err
	})
}

func TestKubeconfig(t *testing.T) {
	t.Parallel()
	path := t.TempDir() + "/kubeconfig"
	if err := sim.WriteKubeconfig(path); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(cfg.Host, "https://127.0.0.1:") {
		t.Errorf("server %s, want https://127.0.0.1:PORT", cfg.Host)
	}
	c, err := client.New(cfg, client.Options{Scheme: kubesim.Scheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := c.List(context.Background(), &rayv1.RayJobList{}); err != nil {
		t.Errorf("list RayJobs with the kubeconfig: %v", err)
	}
}

// gcsStore is checkpoints.Store over one bucket.
type gcsStore struct {
	b    *storage.BucketHandle
	name string
}

func (s gcsStore) List(ctx context.Context, prefix string) ([]string, error) {
	var out []string
	it := s.b.Objects(ctx, &storage.Query{Prefix: prefix})
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, a.Name)
	}
}

func (s gcsStore) Read(ctx context.Context, name string, limit int64) ([]byte, error) {
	r, err := s.b.Object(name).NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return nil, checkpoints.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	defer func() { _ = r.Close() }()
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err == nil && int64(len(b)) > limit {
		return nil, fmt.Errorf("%s is larger than %d bytes", name, limit)
	}
	return b, err
}

func (s gcsStore) URI(name string) string { return "gs://" + s.name + "/" + name }

// TestImagePull: with pull=2s, a worker pod bound to its node waits in
// ContainerCreating with PodScheduled true, as a kubelet pulling its image
// reports it, and its containers start two seconds after it was bound.
func TestImagePull(t *testing.T) {
	t.Parallel()
	s := exampleSpec(t, "sim-pull")
	createCluster(t, s)
	sc := kubesim.DefaultScenario()
	sc.Pull = 2 * time.Second
	rj := submit(t, s, manifests.Run{ID: "sim-pull-0001", Attempt: 1, SpecHash: s.Hash()}, sc)
	pulling := false
	waitFor(t, "worker pods running after their pull", 40*time.Second, func() (bool, error) {
		pods := listPods(t, "sim-pull", "worker")
		running := 0
		for _, p := range pods {
			for _, c := range p.Status.ContainerStatuses {
				if w := c.State.Waiting; w != nil && w.Reason == "ContainerCreating" && p.Status.Phase == corev1.PodPending {
					pulling = pulling || scheduledAt(&p) != nil
				}
			}
			if p.Status.Phase == corev1.PodRunning {
				running++
			}
		}
		return len(pods) == 2 && running == 2, nil
	})
	if !pulling {
		t.Error("no worker pod was seen bound to a node with its containers in ContainerCreating")
	}
	for _, p := range listPods(t, "sim-pull", "worker") {
		at := scheduledAt(&p)
		if at == nil || len(p.Status.ContainerStatuses) == 0 || p.Status.ContainerStatuses[0].State.Running == nil {
			t.Fatalf("pod %s: scheduled %v, containers %+v", p.Name, at, p.Status.ContainerStatuses)
		}
		// The API server keeps whole seconds.
		if pull := p.Status.ContainerStatuses[0].State.Running.StartedAt.Sub(at.Time); pull < time.Second {
			t.Errorf("pod %s: containers started %v after it was bound, want about 2s", p.Name, pull)
		}
		// The kubelet's events tell the same story (kubectl describe pod).
		// A kubelet orders nothing between its status updates and its
		// events, so they are waited for, not read once.
		var reasons []string
		want := []string{"Pulling", "Scheduled", "Pulled", "Created", "Started"}
		waitFor(t, "pod "+p.Name+"'s kubelet events", 20*time.Second, func() (bool, error) {
			evs := &corev1.EventList{}
			if err := k8s.List(context.Background(), evs, client.InNamespace("default")); err != nil {
				return false, err
			}
			reasons = reasons[:0]
			for _, e := range evs.Items {
				if e.InvolvedObject.Name != p.Name {
					continue
				}
				reasons = append(reasons, e.Reason)
				if e.Reason == "Pulled" && !strings.Contains(e.Message, "Successfully pulled image") {
					return false, fmt.Errorf("pod %s: Pulled says %q", p.Name, e.Message)
				}
			}
			for _, r := range want {
				if !slices.Contains(reasons, r) {
					return false, fmt.Errorf("pod %s: events %v, no %s", p.Name, reasons, r)
				}
			}
			return true, nil
		})
	}
	rayJobEnds(t, rj.Name, rayv1.JobDeploymentStatusComplete, 40*time.Second)
}

// scheduledAt is when the pod was bound to a node, nil while it is not.
func scheduledAt(p *corev1.Pod) *metav1.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionTrue {
			return &c.LastTransitionTime
		}
	}
	return nil
}
