// Package pipeline is the machinery the four functions share: their
// dependencies, the messages that chain them, the cluster lease that queues
// runs behind each other, public events, and the boundary that turns errors
// into acknowledgements or redeliveries.
package pipeline

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"time"

	"cloud.google.com/go/storage"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	rayclient "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned"
	"google.golang.org/api/googleapi"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/events"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Runs keeps run records (runs.Store in production).
type Runs interface {
	Create(ctx context.Context, r *runs.Record) error
	Get(ctx context.Context, runID string) (*runs.Record, error)
	Update(ctx context.Context, runID string, fn func(*runs.Record) error) (*runs.Record, error)
	List(ctx context.Context) ([]runs.Summary, error)
}

// ErrTooLarge is returned by Objects.Read for an object over its limit.
var ErrTooLarge = errors.New("object too large")

// Objects reads Cloud Storage objects.
type Objects interface {
	// Read returns an object's content and custom metadata; a missing object
	// is checkpoints.ErrNotFound, one larger than limit ErrTooLarge.
	Read(ctx context.Context, bucket, name string, limit int64) ([]byte, map[string]string, error)
	// Bucket is a checkpoints.Store over a bucket.
	Bucket(bucket string) checkpoints.Store
	// Create writes a new object; ErrExists if the name is taken.
	Create(ctx context.Context, bucket, name string, data []byte, contentType string) error
}

// ErrExists is returned by Objects.Create for a name already taken.
var ErrExists = errors.New("object already exists")

// Publisher publishes Pub/Sub messages.
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) error
}

// Deps are what every function needs.
type Deps struct {
	Config    Config
	Runs      Runs
	Objects   Objects
	Publisher Publisher
	// Bus, when the deployment names a message bus (Config.EventBus),
	// receives every public event too (bus.go); the events it has not
	// taken wait in StateBucket, the bucket of the run records.
	Bus         Bus
	StateBucket *storage.BucketHandle
	Leases      LeaseStore
	Ray         rayclient.Interface
	// Kube is the core API group only (the trainer ConfigMaps): the full
	// clientset would link and initialise every API group of Kubernetes.
	Kube corev1client.CoreV1Interface
	Log  *slog.Logger
	// Clock is the one clock of the pipeline: the run and lease stores
	// built by NewDeps share it.
	Clock runs.Clock
}

// Time is the current time in UTC.
func (d *Deps) Time() time.Time { return d.Clock.Now() }

// Step is the message that chains the functions: which run, which attempt.
// Attempt 0 is a run that never got one: a run cancelled while it waited
// (ACCEPTED or QUEUED), or a rejected one, still goes through finalize, which
// ends it, takes it off its cluster's queue and announces it.
type Step struct {
	RunID   string `json:"runId"`
	Attempt int    `json:"attempt"`
	// Published names the events the sender claimed, and published before
	// sending this message, without recording them published: the
	// receiver records them in its first write, which saves the sender a
	// write of the record.
	Published []runs.Phase `json:"published,omitempty"`
}

// Send publishes a step message to topic.
func (d *Deps) Send(ctx context.Context, topic string, s Step) error {
	b, _ := json.Marshal(s)
	if err := d.Publisher.Publish(ctx, topic, b, map[string]string{"runId": s.RunID}); err != nil {
		return fmt.Errorf("publish %s for run %s: %w", topic, s.RunID, err)
	}
	return nil
}

// Recovery after a crash. Every hop is delivered at least once, but a
// delivery whose instance died may not come back soon, or at all (its
// message can run out of delivery attempts), so the monitor's sweep is what
// bounds recovery, and these constants fix the bound (RecoveryBound):
//
//   - A delivery claims a public event before publishing it (Announce). The
//     claim holds the others off for ClaimFor; the claimer publishes under a
//     deadline of publishWithin, so a live claimer has published, or given
//     its claim up, by then. Only a claimer that died leaves a claim behind,
//     and it expires ClaimFor after it was taken.
//   - A step whose record has not changed for StaleStep (a run ACCEPTED but
//     never admitted, PROVISIONED never submitted, FINISHING never
//     finalized, or ended but never announced) is driven on by the next
//     sweep: it re-admits the run or resends the step's message. StaleStep
//     is longer than ClaimFor, so a claim left by the dead delivery has
//     expired when the step is retried. SUBMITTED and RUNNING runs are
//     checked on every tick.
//   - The sweep runs on every scheduler tick.
const (
	ClaimFor      = 10 * time.Second
	publishWithin = 5 * time.Second
	StaleStep     = 20 * time.Second
)

// HolderWithoutRecord is how long a cluster's lease may name a run that
// has no record before the sweep takes the lease back: a new run takes its
// cluster before its record is created, so a holder without a record may
// be a delivery at work. This is longer than a delivery can last (the
// functions' timeout, timeout_seconds in infra/gcp/functions.tf); only a
// delivery that died and was never redelivered leaves such a lease.
const HolderWithoutRecord = 10 * time.Minute

// RecoveryBound is the longest a run stalls after the instance handling it
// died, with ticks every tick: its last write is at most StaleStep old when
// a sweep first sees it stale, and that sweep comes at most one tick later.
// After that the run goes on as it would have. A redelivery of the dead
// delivery usually comes sooner: Eventarc retries after 10 s or more, when
// the dead delivery's claim has expired.
func RecoveryBound(tick time.Duration) time.Duration { return StaleStep + tick }

// errClaimed means another delivery is publishing this event right now.
var errClaimed = errors.New("another delivery is publishing this event")

// claim takes, in the record being written, the right to publish the event
// of phase p: false when it has gone out or another delivery holds a fresh
// claim to it. The claim holds the others off for ClaimFor.
func claim(r *runs.Record, p runs.Phase, now time.Time) bool {
	if r.WasPublished(p) {
		return false
	}
	if t, ok := r.Publishing[p]; ok && now.Sub(t) < ClaimFor {
		return false
	}
	if r.Publishing == nil {
		r.Publishing = map[runs.Phase]time.Time{}
	}
	r.Publishing[p] = now
	return true
}

// ClaimPending claims, in the record being written, the events of the
// phases the run has entered whose event has not gone out, in order
// (ClaimOwed), unless the run has ended: finalize announces what an ended
// run still owes, once the cluster is released.
func ClaimPending(r *runs.Record, now time.Time) []runs.Phase {
	if r.Phase.Terminal() {
		return nil
	}
	claimed, _ := ClaimOwed(r, now)
	return claimed
}

// ClaimOwed claims, in the record being written, the events the run owes:
// those of the phases it entered whose event has not gone out, in order
// (an ended run's terminal one last). It stops before one that another
// delivery holds a fresh claim to (held), so that no event goes out before
// one of a phase the run entered earlier.
func ClaimOwed(r *runs.Record, now time.Time) (claimed []runs.Phase, held bool) {
	for _, e := range r.History {
		if e.Phase.Event() == "" || slices.Contains(claimed, e.Phase) || r.WasPublished(e.Phase) {
			continue
		}
		if !claim(r, e.Phase, now) {
			return claimed, true
		}
		claimed = append(claimed, e.Phase)
	}
	return claimed, false
}

// PublishClaimed publishes the events of phases, which this delivery
// claimed in rec at claimedAt, in order, and records them published. Work
// done since the claim (releasing a cluster) may have taken most of
// ClaimFor: then it renews the claims first, so that no other delivery
// publishes them meanwhile. It returns the record as last written.
func (d *Deps) PublishClaimed(ctx context.Context, rec *runs.Record, phases []runs.Phase, claimedAt time.Time) (*runs.Record, error) {
	if len(phases) == 0 {
		return rec, nil
	}
	if now := d.Time(); now.Sub(claimedAt) > ClaimFor-publishWithin {
		var err error
		rec, err = d.Runs.Update(ctx, rec.RunID, func(cur *runs.Record) error {
			for _, p := range phases {
				if t, ok := cur.Publishing[p]; !ok || !t.Equal(claimedAt) {
					return fmt.Errorf("run %s, %s event: %w", cur.RunID, p.Event(), errClaimed)
				}
				cur.Publishing[p] = now
			}
			return nil
		})
		if err != nil {
			return nil, err
		}
		claimedAt = now
	}
	if err := d.Publish(ctx, rec, phases, claimedAt); err != nil {
		return nil, err
	}
	return d.MarkPublished(ctx, rec.RunID, phases)
}

// Advance changes the run's record with fn and, in the same write, claims
// its pending events (ClaimPending); then it publishes them, in order, and
// records them published. Folding the claim into the transition saves a
// write of the record, which Cloud Storage allows about once a second.
// fn may refuse with runs.ErrNoChange: the events are still claimed and
// published. It returns the record as last written.
func (d *Deps) Advance(ctx context.Context, runID string, fn func(*runs.Record) error) (*runs.Record, error) {
	now := d.Time()
	var claimed []runs.Phase
	rec, err := d.Runs.Update(ctx, runID, func(r *runs.Record) error {
		err := fn(r)
		if err != nil && !errors.Is(err, runs.ErrNoChange) {
			return err
		}
		claimed = ClaimPending(r, now)
		if len(claimed) == 0 {
			return err
		}
		return nil
	})
	if err != nil {
		return rec, err
	}
	return d.PublishClaimed(ctx, rec, claimed, now)
}

// Announce publishes the public event of phase for the record once. A
// delivery first claims the event in the record (compare-and-swap), so
// concurrent deliveries never both publish; it marks the event published
// after Pub/Sub took it. Only a delivery that dies between the two leaves a
// stale claim, and the next one then publishes again under the same
// CloudEvent ID, which subscribers can use to drop the copy.
func (d *Deps) Announce(ctx context.Context, r *runs.Record, p runs.Phase) (*runs.Record, error) {
	if p.Event() == "" {
		return nil, Permanent(fmt.Errorf("phase %s has no public event", p))
	}
	if r.WasPublished(p) {
		return r, nil
	}
	now := d.Time()
	r, err := d.Runs.Update(ctx, r.RunID, func(cur *runs.Record) error {
		if cur.WasPublished(p) {
			return runs.ErrNoChange
		}
		if !claim(cur, p, now) {
			return errClaimed
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("announce %s of run: %w", p.Event(), err)
	}
	if r.WasPublished(p) {
		return r, nil
	}
	return d.PublishClaimed(ctx, r, []runs.Phase{p}, now)
}

// Publish publishes the events of phases, which this delivery claimed in
// rec at now, in order, all within publishWithin of each other. If one
// fails, the claims of those not published are given up at once, so a
// redelivery publishes them without waiting for the claims to expire.
// Then the deployment's message bus gets them (toBus), off the topic's
// deadline: a bus that is down or slow costs the run busWithin at most.
func (d *Deps) Publish(ctx context.Context, rec *runs.Record, phases []runs.Phase, now time.Time) error {
	pctx, cancel := context.WithTimeout(ctx, publishWithin)
	defer cancel()
	sent := make([]cloudevents.Event, 0, len(phases))
	for i, p := range phases {
		e, err := events.New(d.Config.EventSource, EventData(rec, p, d.Config), now)
		if err == nil {
			err = d.Publisher.Publish(pctx, d.Config.Topics.Events, e.Data(), events.PubSubAttributes(e))
		}
		if err != nil {
			// The claims of those not published are given up at once.
			_, _ = d.settle(ctx, rec.RunID, phases[:i], phases[i:])
			return fmt.Errorf("publish %s event of run %s: %w", p.Event(), rec.RunID, err)
		}
		d.Log.Info("event_published", "run_id", rec.RunID, "type", e.Type())
		sent = append(sent, e)
	}
	for _, e := range sent {
		if err := d.toBus(ctx, rec.RunID, e); err != nil {
			// Not on the bus and not written down: publish them all again
			// (the topic's subscribers drop the copies by CloudEvent ID).
			_, _ = d.settle(ctx, rec.RunID, nil, phases)
			return err
		}
	}
	return nil
}

// MarkPublished records that the events of phases have gone out.
func (d *Deps) MarkPublished(ctx context.Context, runID string, phases []runs.Phase) (*runs.Record, error) {
	return d.settle(ctx, runID, phases, nil)
}

// settle ends this delivery's claims in one write: the events of published
// have gone out, those of released may be published by anyone.
func (d *Deps) settle(ctx context.Context, runID string, published, released []runs.Phase) (*runs.Record, error) {
	return d.Runs.Update(ctx, runID, func(cur *runs.Record) error {
		for _, p := range published {
			cur.MarkPublished(p)
			delete(cur.Publishing, p)
		}
		for _, p := range released {
			delete(cur.Publishing, p)
		}
		return nil
	})
}

// EventData is the data of a run's public event of phase.
func EventData(r *runs.Record, p runs.Phase, cfg Config) events.Run {
	d := events.Run{
		RunID: r.RunID, Name: r.Name, Source: r.Source, SpecHash: r.SpecHash,
		Phase: p.Event(), Problems: r.Problems, Attempt: r.Attempt, Cluster: r.Cluster,
	}
	if p == r.Phase || p.Terminal() {
		d.Reason, d.Message = r.Reason, r.Message
	}
	if p == runs.Running || p.Terminal() {
		d.Capacity = capacityOf(r, r.UpdatedAt)
	}
	if r.Check != nil && r.Check.Result != nil {
		d.DataCheck = r.Check.Result
	}
	if !p.Terminal() {
		return d
	}
	end := r.UpdatedAt
	if t, ok := r.Times[r.Phase]; ok {
		end = t
	}
	d.EndedAt = &end
	if t, ok := r.Times[runs.Accepted]; ok {
		d.StartedAt = &t
	} else if !r.CreatedAt.IsZero() {
		c := r.CreatedAt
		d.StartedAt = &c
	}
	d.Timings = timings(r, end)
	d.Report = r.Report
	if r.Result != nil {
		d.Checkpoints = r.Result.Checkpoints
		d.LatestCheckpoint = r.Result.Latest
		d.BestCheckpoint, d.BestBy = r.Result.Best, r.Result.BestBy
		d.FinalMetrics = r.Result.FinalMetrics
		if m := r.Result.Mark; m != nil {
			d.Data, d.Samples = m.Data, m.Samples
			if m.Samples != nil {
				d.Timings["sampleAnswers"] = m.Samples.Seconds
			}
		}
	}
	h, cost := GPUCost(r, end, cfg.GPUHourUSD)
	d.GPUHours, d.EstimatedCostUSD = &h, &cost
	return d
}

// capacityOf is where the current attempt's workers came from, nil for a
// run without an attempt.
func capacityOf(r *runs.Record, end time.Time) *events.Capacity {
	a := r.CurrentAttempt()
	if a == nil || r.Spec == nil {
		return nil
	}
	t := r.Spec.Tier(a.Tier)
	c := &events.Capacity{Tier: t.Name(), Type: t.Type, Index: a.Tier + 1, Served: a.RunningAt != nil, Waiting: a.Waiting}
	_, c.Preemptions = r.Lost()
	if a.RunningAt != nil {
		end = *a.RunningAt
	} else if a.EndedAt != nil {
		end = *a.EndedAt
	}
	c.WaitSeconds = max(end.Sub(a.CreatedAt).Seconds(), 0)
	return c
}

// timings is the seconds spent in each phase the run went through, every
// entry counted (a retry's time in PROVISIONED goes to PROVISIONED), and the
// total.
func timings(r *runs.Record, end time.Time) map[string]float64 {
	out := map[string]float64{}
	for p, d := range r.Durations(end) {
		out[string(p)] = d.Seconds()
	}
	out["total"] = end.Sub(r.CreatedAt).Seconds()
	return out
}

// GPUCost is the GPU time the run used and its price: for every attempt
// that ran, the GPUs its workers use times the time from when they all ran
// to its end, at the price of the capacity tier that served it (the tier's
// gpuHourUsd, else price). An attempt still waiting for capacity holds no
// GPUs.
func GPUCost(r *runs.Record, end time.Time, price float64) (hours, usd float64) {
	if r.Spec == nil {
		return 0, 0
	}
	gpus := float64(r.Spec.Training.Workers)
	for _, a := range r.Attempts {
		if a.RunningAt == nil {
			continue
		}
		stop := end
		if a.EndedAt != nil {
			stop = *a.EndedAt
		}
		d := stop.Sub(*a.RunningAt)
		if d <= 0 {
			continue
		}
		p := price
		if t := r.Spec.Tier(a.Tier); t.GPUHourUSD > 0 {
			p = t.GPUHourUSD
		}
		hours += d.Hours() * gpus
		usd += d.Hours() * gpus * p
	}
	return hours, usd
}

// permanent marks an error no redelivery can fix.
type permanent struct{ err error }

func (p permanent) Error() string { return p.err.Error() }
func (p permanent) Unwrap() error { return p.err }

// Permanent wraps err so the boundary acknowledges the event.
func Permanent(err error) error {
	if err == nil {
		return nil
	}
	return permanent{err}
}

// IsPermanent reports whether err was marked Permanent.
func IsPermanent(err error) bool {
	var p permanent
	return errors.As(err, &p)
}

// Unreadable reports whether err says an object cannot be read and never
// will be: a malformed or oversized object, or a bucket the function's
// identity may not read (Cloud Storage's 401 and 403). A handler that meets
// one ends the run rather than retrying forever with its workers up.
func Unreadable(err error) bool {
	var ge *googleapi.Error
	return errors.Is(err, checkpoints.ErrUnreadable) || errors.Is(err, ErrTooLarge) ||
		errors.As(err, &ge) && (ge.Code == http.StatusForbidden || ge.Code == http.StatusUnauthorized)
}

// Boundary logs a handler's failure once and decides the reply: nil (the
// platform acknowledges) for success and permanent errors, the error (HTTP
// 500, redelivery with backoff) for the rest.
func Boundary(log *slog.Logger, function string, err error, attrs ...any) error {
	if err == nil {
		return nil
	}
	attrs = append(attrs, "function", function, "error", err.Error())
	if IsPermanent(err) {
		log.Error("event_dropped", attrs...)
		return nil
	}
	log.Warn("event_retry", attrs...)
	return err
}
