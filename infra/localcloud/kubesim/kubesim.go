// Package kubesim is the Kubernetes side of the local cloud: a real etcd and
// kube-apiserver with the KubeRay CRDs, KubeRay's own RayCluster and RayJob
// reconcilers running in-process, and stand-ins for what a cluster adds
// around them:
//
//   - a kubelet, which marks every Pod Running and Ready;
//   - a Job controller, which drives the KubeRay submitter batch/v1 Job's
//     status the way `ray job submit` exiting would;
//   - a garbage collector, which deletes objects whose controlling owner is
//     gone;
//   - a Ray head (KubeRay's FakeRayDashboardClient, scripted per job) and a
//     player that stands in for the trainer: for each submitted Ray job it
//     writes into Cloud Storage the layout the real trainer and Ray Train V1
//     write (result.json, checkpoint_00000N folders, the raydrop_result.json
//     completion mark), following a Scenario.
//
// Everything listens on 127.0.0.1 only.
package kubesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"

	"cloud.google.com/go/storage"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// Options configure Start.
type Options struct {
	// Assets is the folder holding the etcd and kube-apiserver binaries
	// (default $KUBEBUILDER_ASSETS).
	Assets string
	// CRDDir is the folder of KubeRay's CRDs (default: config/crd/bases of
	// the KubeRay module in the module cache, found with `go list -m`).
	CRDDir string
	// Storage is the Cloud Storage client the player writes through (for
	// the local cloud, one talking to fake-gcs-server through
	// STORAGE_EMULATOR_HOST). Nil: Ray jobs still play on the dashboard but
	// write nothing.
	Storage *storage.Client
	// Project is the project ID buckets are created in (default "localcloud").
	Project string
	// Scenario says how each RayJob's Ray job plays; nil plays every job
	// with DefaultScenario. It is called once per submission.
	Scenario func(ctx context.Context, job *rayv1.RayJob) Scenario
	// Hub is the Hugging Face Hub's endpoint the trainer stand-in stages
	// base models from and the data check reads models and datasets from
	// (the local cloud's, package hub).
	Hub string
	// StorageHost is the Cloud Storage emulator's host:port that Storage
	// talks to, which the data check's Python reads as
	// STORAGE_EMULATOR_HOST.
	StorageHost string
	// Python is the trainer's Python (its virtualenv's), which runs the
	// data check (trainer/datacheck.py) for real. Empty: every data check
	// fails, saying so.
	Python string
	// Kueue says Kueue runs against this API server: the garbage
	// collector then also deletes the Workloads of deleted RayJobs.
	Kueue bool
	// Log receives the simulator's records; KubeRay's and
	// controller-runtime's go to it too, info as Debug and errors as Warn.
	// Nil discards everything.
	Log *slog.Logger
}

// Outcome is how a simulated Ray job ends.
type Outcome string

const (
	// Succeed trains every step, saves every checkpoint, writes a
	// succeeded completion mark; the Ray job ends SUCCEEDED.
	Succeed Outcome = "succeed"
	// Fail raises an application error at step At: a failed completion
	// mark, error.txt in the trial folder; the Ray job ends FAILED.
	Fail Outcome = "fail"
	// LoseHead loses the Ray head at step At: its Pod is deleted (the
	// RayCluster reconciler recreates it), no mark is written, and the new
	// head no longer knows the job. KubeRay then fails the RayJob.
	LoseHead Outcome = "lose-head"
	// Hang stops making progress at step At and stays RUNNING until the
	// job is stopped (deleting the RayJob stops it): rank Rank waits on a
	// read of its data, the others in the all-reduce of step At; the
	// ranks' heartbeats go on with the step before, and their stacks say
	// so when the monitor asks (stacks.go).
	Hang Outcome = "hang"
	// Preempt reclaims a worker's node at step At (capacity.go): the pod is
	// marked disrupted and failed, the trainer finishes step At, saves a
	// checkpoint of it on the notice, writes a preempted mark and stops;
	// the Ray job ends FAILED.
	Preempt Outcome = "preempt"
	// Reclaim reclaims a worker's node during step At, and the step
	// outlasts the node's notice (GKE gives a Spot VM's pods 15 of its 30
	// seconds): the worker dies before it ends the step, so it never sees
	// the notice. KubeRay deletes the failed pod; only then does the driver
	// hear of the dead worker and write a failed mark. The Ray job ends
	// FAILED, and the pod's own evidence is gone before anyone looks.
	Reclaim Outcome = "reclaim"
	// ReclaimInSave reclaims a worker's node during step At; the worker
	// sees the notice at the step's end and tells the driver, but the node
	// goes before the save of step At ends: that checkpoint folder is left
	// partial, KubeRay deletes the failed pod, and the driver writes a
	// failed mark that says a notice came (noticeSeen).
	ReclaimInSave Outcome = "reclaim-in-save"
)

// Scenario is how one Ray job plays.
type Scenario struct {
	Outcome Outcome
	// At is the global step at which fail, lose-head or hang happens: the
	// steps before it are reported, step At is not. It is clamped to the
	// steps the run has (a resumed run starts after its checkpoint's step).
	// Ignored for succeed.
	At int
	// StepsPerEpoch is the optimizer steps per epoch (default 4).
	StepsPerEpoch int
	// StepTime is the wall time of one optimizer step (default 150ms).
	StepTime time.Duration
	// PendingFor is how long the job is PENDING before RUNNING (default 300ms).
	PendingFor time.Duration
	// Error is the application error of a failing run, as the trainer
	// writes it ("SomeError: message"). Default: a RuntimeError naming the step.
	Error string
	// Refuse is the capacity tiers (spec.TierReservation, …) that have no
	// nodes for the job's workers, each for how long from the RayJob's
	// creation (0: for as long as the job lasts). Ignored by pods already
	// running.
	Refuse map[string]time.Duration
	// Pull is how long a worker pod of the job takes from being bound to a
	// node until its containers run, as the kubelet's image pull and
	// container start take (default 0: at once). The pod is Pending with
	// PodScheduled true and its containers waiting in ContainerCreating
	// meanwhile, as the kubelet reports it.
	Pull time.Duration
	// Env, Weights and Data are how long the trainer takes, once the Ray
	// job runs, before its train function begins (Ray's runtime env), to
	// get its base model, and to read its data (default 0 each); the first
	// report tells them (raydrop_startup), as the trainer's does.
	Env, Weights, Data time.Duration
	// PreemptAt is a run's preemption steps, one per attempt: the local
	// cloud plays attempt n as Preempt at PreemptAt[n-1] and lets the
	// attempts after the list succeed. The player itself reads Outcome
	// and At.
	PreemptAt []int
	// PreemptAs is how each attempt in PreemptAt loses its node: Preempt
	// (the default: the save on notice ends), Reclaim or ReclaimInSave.
	PreemptAs Outcome
	// Hangs, for hang, is how many attempts hang before one succeeds (0:
	// every attempt hangs).
	Hangs int `json:"hangs,omitempty"`
	// Rank is the rank that fails in cuda-oom, nccl-timeout, oom-killed
	// and host-oom, or hangs in hang (nil: the last).
	Rank *int `json:"rank,omitempty"`
	// DroppedRows is how many of the dataset's rows are longer than
	// --max-seq-length (default 0). The dataset has one epoch's samples plus
	// these; above --max-dropped-share the job fails before training, with
	// the trainer's message.
	DroppedRows int
}

// DefaultScenario is a run that succeeds.
func DefaultScenario() Scenario {
	return Scenario{Outcome: Succeed, StepsPerEpoch: 4, StepTime: 150 * time.Millisecond, PendingFor: 300 * time.Millisecond}
}

func (sc Scenario) withDefaults() Scenario {
	d := DefaultScenario()
	if sc.Outcome == "" {
		sc.Outcome = d.Outcome
	}
	if sc.StepsPerEpoch <= 0 {
		sc.StepsPerEpoch = d.StepsPerEpoch
	}
	if sc.StepTime <= 0 {
		sc.StepTime = d.StepTime
	}
	if sc.PendingFor <= 0 {
		sc.PendingFor = d.PendingFor
	}
	return sc
}

// JobStatusLost is a JobRecord status beside Ray's own: the head that ran
// the job is gone and the new head does not know the job (the dashboard
// answers 404).
const JobStatusLost rayv1.JobStatus = "LOST"

// JobRecord is what the player did for one Ray job.
type JobRecord struct {
	SubmissionID string            `json:"submissionId"`
	RayJob       string            `json:"rayJob"`  // namespace/name
	Cluster      string            `json:"cluster"` // RayCluster name
	Scenario     Scenario          `json:"scenario"`
	Args         map[string]string `json:"args"`                 // the trainer flags, without "--"
	Experiment   string            `json:"experiment,omitempty"` // gs://bucket/prefix/experiment
	Trial        string            `json:"trial,omitempty"`      // trial folder URI
	ResumedFrom  int               `json:"resumedFrom"`          // global step of --resume-from, or 0
	LastStep     int               `json:"lastStep"`             // last step reported
	TotalSteps   int               `json:"totalSteps"`
	Checkpoints  []string          `json:"checkpoints"` // checkpoint_00000N folder URIs, oldest first
	Mark         string            `json:"mark,omitempty"`
	Status       rayv1.JobStatus   `json:"status"` // PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED or LOST
	Error        string            `json:"error,omitempty"`
	HeadPod      string            `json:"headPod,omitempty"` // the head Pod deleted by lose-head
	StopCalls    int               `json:"stopCalls"`
	Submitted    time.Time         `json:"submitted"`
	Started      time.Time         `json:"started,omitzero"`
	Ended        time.Time         `json:"ended,omitzero"`
	// Evidence is the attempt's evidence folder the RayJob names in its
	// runtime env, where the Ray pods' log sidecars copy (raylogs.go).
	Evidence string `json:"evidence,omitempty"`
	// StagedModel: this job copied the base model from the Hub into the
	// staging bucket (--stage-model true, and no marker there yet).
	StagedModel bool `json:"stagedModel,omitempty"`
}

// Sim is a running Kubernetes side of the local cloud.
type Sim struct {
	// Config reaches the API server as cluster admin.
	Config *rest.Config
	// Client is the manager's client: cached reads, direct writes.
	Client client.Client

	o          Options
	log        *slog.Logger
	env        *envtest.Environment
	kubeconfig []byte
	cancel     context.CancelFunc
	mgrDone    chan error
	dash       *dashboard
	dir        string // the kubelets' certificates and the containers' logs
	logs       *containerLogs
	rayLogs    rayNodeLogs // each Ray pod's Ray log folder (raylogs.go)
	kubeletSrv *kubeletServer

	stopOnce sync.Once
	stopErr  error
}

// Kubeconfig is a kubeconfig for a cluster-admin user (client certificate,
// server https://127.0.0.1:PORT, CA inline) that other processes and kubectl
// can use.
func (s *Sim) Kubeconfig() []byte { return append([]byte(nil), s.kubeconfig...) }

// WriteKubeconfig writes Kubeconfig to path with mode 0600.
func (s *Sim) WriteKubeconfig(path string) error {
	if err := os.WriteFile(path, s.kubeconfig, 0o600); err != nil {
		return fmt.Errorf("write kubeconfig: %w", err)
	}
	return nil
}

// User is a rest.Config that authenticates as user (a client certificate
// signed by the API server's client CA), with no group: what it may do is
// what RBAC grants that name, as on GKE, where a Google service account
// authenticates under its email and holds only what is bound to it.
func (s *Sim) User(name string) (*rest.Config, error) {
	u, err := s.env.ControlPlane.AddUser(envtest.User{Name: name}, nil)
	if err != nil {
		return nil, fmt.Errorf("kubesim: add user %s: %w", name, err)
	}
	return u.Config(), nil
}

// Played returns a record per Ray job submitted so far, in submission order.
func (s *Sim) Played() []JobRecord { return s.dash.records() }

// Stop stops the players and the manager, then the API server and etcd,
// and removes their data. It is safe to call more than once.
func (s *Sim) Stop() error {
	s.stopOnce.Do(func() {
		var errs []error
		if s.cancel != nil {
			s.cancel()
		}
		if s.dash != nil {
			s.dash.wait(10 * time.Second)
		}
		if s.mgrDone != nil {
			select {
			case err := <-s.mgrDone:
				if err != nil && !errors.Is(err, context.Canceled) {
					errs = append(errs, fmt.Errorf("manager: %w", err))
				}
			case <-time.After(15 * time.Second):
				errs = append(errs, errors.New("manager did not stop within 15s"))
			}
		}
		if s.env != nil {
			if err := s.env.Stop(); err != nil {
				errs = append(errs, fmt.Errorf("stop kube-apiserver and etcd: %w", err))
			}
		}
		if s.kubeletSrv != nil {
			if err := s.kubeletSrv.stop(); err != nil {
				errs = append(errs, fmt.Errorf("stop the kubelet endpoint: %w", err))
			}
		}
		if s.dir != "" {
			if err := os.RemoveAll(s.dir); err != nil {
				errs = append(errs, err)
			}
		}
		s.stopErr = errors.Join(errs...)
		s.log.Info("kubesim stopped", "err", s.stopErr)
	})
	return s.stopErr
}
