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
	"time"

	"cloud.google.com/go/storage"
	rayclient "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/runs"
)

// Runs keeps run records (runs.Store in production).
type Runs interface {
	Create(ctx context.Context, r *runs.Record) error
	Get(ctx context.Context, runID string) (*runs.Record, error)
	Update(ctx context.Context, runID string, fn func(*runs.Record) error) (*runs.Record, error)
	List(ctx context.Context) ([]runs.Summary, error)
}

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

// Publisher publishes Pub/Sub messages.
type Publisher interface {
	Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) error
}

// Deps are what every function needs.
type Deps struct {
	Config    config.Config
	Runs      Runs
	Sweeps    SweepStore
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
	RunID   string `json:"runId,omitempty"`
	Attempt int    `json:"attempt"`
	// SweepID, instead of a run, names a sweep to advance: the monitor
	// moves it on (a cancellation), finalize ends it once its trials have.
	SweepID string `json:"sweepId,omitempty"`
	// Published names the events the sender claimed, and published before
	// sending this message, without recording them published: the
	// receiver records them in its first write, which saves the sender a
	// write of the record.
	Published []runs.Phase `json:"published,omitempty"`
}

// Send publishes a step message to topic.
func (d *Deps) Send(ctx context.Context, topic string, s Step) error {
	b, _ := json.Marshal(s)
	attrs := map[string]string{"runId": s.RunID}
	if s.SweepID != "" {
		attrs = map[string]string{"sweepId": s.SweepID}
	}
	if err := d.Publisher.Publish(ctx, topic, b, attrs); err != nil {
		return fmt.Errorf("publish %s for run %s%s: %w", topic, s.RunID, s.SweepID, err)
	}
	return nil
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
