package kubesim

import (
	"context"
	"sync"
	"time"

	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/dashboardclient"
	utiltypes "github.com/ray-project/kuberay/ray-operator/controllers/ray/utils/types"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// Messages the Ray dashboard gives per job status (Ray 2.48).
const (
	msgPending   = "Job has not started yet. It may be waiting for the runtime environment to be set up."
	msgRunning   = "Job is currently running."
	msgSucceeded = "Job finished successfully."
	msgFailed    = "Job entrypoint command failed with exit code 1"
	msgBadFlags  = "Job entrypoint command failed with exit code 2"
	msgStopped   = "Job was intentionally stopped."
)

// dashboard is the Ray head as KubeRay sees it: KubeRay's own
// FakeRayDashboardClient, whose GetJobInfoMock answers from the plays,
// keyed by submission ID (RayJob spec.jobId / status.jobId).
type dashboard struct {
	ctx  context.Context // ends when the simulator stops
	sim  *Sim
	fake *utils.FakeRayDashboardClient

	mu    sync.Mutex
	plays map[string]*play
	order []*play
	wg    sync.WaitGroup
}

func newDashboard(ctx context.Context, s *Sim) *dashboard {
	d := &dashboard{ctx: ctx, sim: s, fake: &utils.FakeRayDashboardClient{}, plays: map[string]*play{}}
	mock := func(_ context.Context, jobID string) (*utiltypes.RayJobInfo, error) { return d.jobInfo(jobID) }
	d.fake.GetJobInfoMock.Store(&mock)
	return d
}

// submit is the submitter Job's pod running (KubeRay's submitter asks
// `ray job status` first and submits only an unknown ID): it starts a play
// for a new submission ID, or for one whose head was lost since if a new
// submitter Job asks, and returns the job's play. It is idempotent per Job.
func (d *dashboard) submit(job *batchv1.Job, id string) *play {
	d.mu.Lock()
	defer d.mu.Unlock()
	if p := d.plays[id]; p != nil && (p.job == job.UID || p.snapshot().Status != JobStatusLost) {
		return p
	}
	if d.ctx.Err() != nil {
		return nil
	}
	p := newPlay(d, job, id)
	d.plays[id] = p
	d.order = append(d.order, p)
	d.wg.Add(1)
	go func() {
		defer d.wg.Done()
		p.run(d.ctx)
	}()
	return p
}

func (d *dashboard) get(id string) *play {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.plays[id]
}

func (d *dashboard) records() []JobRecord {
	d.mu.Lock()
	ps := append([]*play(nil), d.order...)
	d.mu.Unlock()
	out := make([]JobRecord, 0, len(ps))
	for _, p := range ps {
		out = append(out, p.snapshot())
	}
	return out
}

// wait waits for the plays to return (the simulator's context is done).
func (d *dashboard) wait(limit time.Duration) {
	done := make(chan struct{})
	go func() { d.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(limit):
		d.sim.log.Warn("kubesim: Ray job players did not stop", "after", limit)
	}
}

// notFound is what the dashboard client returns on HTTP 404.
func notFound(id string) error {
	return apierrors.NewBadRequest("Job " + id + " does not exist on the cluster")
}

func (d *dashboard) jobInfo(id string) (*utiltypes.RayJobInfo, error) {
	p := d.get(id)
	if p == nil {
		return nil, notFound(id)
	}
	r := p.snapshot()
	if r.Status == JobStatusLost {
		// The head that ran the job is gone; the new head's GCS starts empty.
		return nil, notFound(id)
	}
	info := &utiltypes.RayJobInfo{
		JobId:        p.rayJobID,
		SubmissionId: id,
		JobStatus:    r.Status,
		Entrypoint:   p.entrypoint,
		StartTime:    uint64(r.Submitted.UnixMilli()),
		Metadata:     map[string]string{},
	}
	if !r.Ended.IsZero() {
		info.EndTime = uint64(r.Ended.UnixMilli())
	}
	switch r.Status {
	case rayv1.JobStatusPending:
		info.Message = msgPending
	case rayv1.JobStatusRunning:
		info.Message = msgRunning
	case rayv1.JobStatusSucceeded:
		info.Message = msgSucceeded
	case rayv1.JobStatusFailed:
		info.Message = p.failMessage()
		info.ErrorType = ptr.To("JOB_ENTRYPOINT_COMMAND_ERROR")
	case rayv1.JobStatusStopped:
		info.Message = msgStopped
	}
	return info, nil
}

// headClient is the FakeRayDashboardClient with StopJob and DeleteJob
// acting on the plays (the fake's own just return nil).
type headClient struct {
	*utils.FakeRayDashboardClient
	d *dashboard
}

func (c headClient) StopJob(ctx context.Context, id string) error {
	if p := c.d.get(id); p != nil {
		p.stopJob()
		c.d.sim.log.Info("Ray job stop requested", "submissionId", id)
	}
	return c.FakeRayDashboardClient.StopJob(ctx, id)
}

func (c headClient) DeleteJob(ctx context.Context, id string) error {
	c.d.sim.log.Info("Ray job delete requested", "submissionId", id)
	return c.FakeRayDashboardClient.DeleteJob(ctx, id)
}

// clientProvider implements utils.ClientProvider as KubeRay's
// configapi.Configuration does, with the scripted head.
type clientProvider struct{ d *dashboard }

var _ utils.ClientProvider = clientProvider{}

func (p clientProvider) GetDashboardClient(_ manager.Manager) func(*rayv1.RayCluster, string) (dashboardclient.RayDashboardClientInterface, error) {
	return func(*rayv1.RayCluster, string) (dashboardclient.RayDashboardClientInterface, error) {
		return headClient{p.d.fake, p.d}, nil
	}
}

func (p clientProvider) GetHttpProxyClient(_ manager.Manager) func(string, string, string, int) utils.RayHttpProxyClientInterface {
	return func(string, string, string, int) utils.RayHttpProxyClientInterface {
		return &utils.FakeRayHttpProxyClient{}
	}
}
