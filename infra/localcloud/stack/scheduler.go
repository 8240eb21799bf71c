package stack

import (
	"context"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/pubsub/v2"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/pkg/names"
)

// Cloud Scheduler's stand-in, and the scenario each simulated Ray job
// plays.

// PauseTicks stops (true) or resumes (false) the scheduler ticker.
func (s *Stack) PauseTicks(pause bool) { s.paused.Store(pause) }

// ticker is Cloud Scheduler: a message on the tick topic every interval.
func (s *Stack) ticker(ctx context.Context, every time.Duration) {
	defer s.wg.Done()
	pub := s.PS.Publisher(Topics.Ticks)
	defer pub.Stop()
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if s.paused.Load() {
				continue
			}
			pub.Publish(ctx, &pubsub.Message{Data: []byte(now.UTC().Format(time.RFC3339))})
		}
	}
}

// Tick publishes one tick now.
func (s *Stack) Tick(ctx context.Context) error {
	pub := s.PS.Publisher(Topics.Ticks)
	defer pub.Stop()
	_, err := pub.Publish(ctx, &pubsub.Message{Data: []byte("tick")}).Get(ctx)
	return err
}

// scenario reads how a RayJob's simulated Ray job plays from the custom
// metadata of the spec object it came from, so tests pick an outcome per
// run without touching the job spec format.
func (s *Stack) scenario(ctx context.Context, job *rayv1.RayJob) kubesim.Scenario {
	sc, err := kubesim.ParseScenario(s.opts.DefaultSim)
	if err != nil {
		sc = kubesim.DefaultScenario()
	}
	src := job.Annotations[names.AnnotSource]
	rest, ok := strings.CutPrefix(src, "gs://")
	if !ok {
		return sc
	}
	rest, _, _ = strings.Cut(rest, "#")
	bucket, object, _ := strings.Cut(rest, "/")
	attrs, err := s.GCS.Bucket(bucket).Object(object).Attrs(ctx)
	if err != nil {
		return sc
	}
	text, ok := attrs.Metadata[SimMetadata]
	if !ok {
		return sc
	}
	parsed, err := kubesim.ParseScenario(text)
	if err != nil {
		s.opts.Log.Warn("bad_scenario", "object", src, "error", err.Error())
		return sc
	}
	n, _ := strconv.Atoi(job.Labels[names.LabelAttempt])
	return parsed.ForAttempt(n)
}
