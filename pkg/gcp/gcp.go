// Package gcp is the production adapters to Google Cloud the functions
// and the raydrop command use: Cloud Storage objects, Pub/Sub publishing,
// the Eventarc Advanced message bus and a GKE cluster's endpoint. Each
// bounds its calls by CallTimeout.
package gcp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"

	publishing "cloud.google.com/go/eventarc/publishing/apiv1"
	"cloud.google.com/go/eventarc/publishing/apiv1/publishingpb"
	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/gcsdoc"
)

// CallTimeout bounds every single Kubernetes, Cloud Storage and Pub/Sub
// call a handler makes, well inside the functions' 540 s timeout, so a
// call that hangs fails and is retried instead of holding the delivery.
const CallTimeout = gcsdoc.CallTimeout

// ErrTooLarge is returned by GCS.Read for an object over its limit.
var ErrTooLarge = errors.New("object too large")

// ErrExists is returned by GCS.Create for a name already taken.
var ErrExists = errors.New("object already exists")

// Unreadable reports whether err says an object cannot be read and never
// will be: a malformed or oversized object, or a bucket the function's
// identity may not read (Cloud Storage's 401 and 403). A handler that meets
// one ends the run rather than retrying forever with its workers up.
func Unreadable(err error) bool {
	var ge *googleapi.Error
	return errors.Is(err, checkpoints.ErrUnreadable) || errors.Is(err, ErrTooLarge) ||
		errors.As(err, &ge) && (ge.Code == http.StatusForbidden || ge.Code == http.StatusUnauthorized)
}

// GCS reads and creates Cloud Storage objects.
type GCS struct{ Client *storage.Client }

// Read reads an object with its custom metadata.
func (g *GCS) Read(ctx context.Context, bucket, name string, limit int64) ([]byte, map[string]string, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	rd, err := g.Client.Bucket(bucket).Object(name).NewReader(ctx)
	if errors.Is(err, storage.ErrObjectNotExist) {
		return nil, nil, checkpoints.ErrNotFound
	}
	if err != nil {
		return nil, nil, fmt.Errorf("read gs://%s/%s: %w", bucket, name, err)
	}
	defer func() { _ = rd.Close() }() // read-only: nothing to lose
	if rd.Attrs.Size > limit {
		return nil, nil, fmt.Errorf("gs://%s/%s is %d bytes: %w", bucket, name, rd.Attrs.Size, ErrTooLarge)
	}
	b, err := io.ReadAll(io.LimitReader(rd, limit+1))
	if err != nil {
		return nil, nil, fmt.Errorf("read gs://%s/%s: %w", bucket, name, err)
	}
	if int64(len(b)) > limit {
		return nil, nil, fmt.Errorf("gs://%s/%s: %w", bucket, name, ErrTooLarge)
	}
	attrs, err := g.Client.Bucket(bucket).Object(name).Attrs(ctx)
	if err != nil {
		return b, nil, nil // the content is what matters
	}
	return b, attrs.Metadata, nil
}

// Create writes a new object under the precondition that none has its name
// (ifGenerationMatch=0), which needs only storage.objects.create: replacing
// an object would also need storage.objects.delete.
// https://cloud.google.com/storage/docs/request-preconditions#special-case
// https://cloud.google.com/storage/docs/access-control/iam-permissions#object_permissions
//
// When the name is taken, Cloud Storage's documentation does not settle
// which answer an identity without storage.objects.delete gets: the
// precondition's 412, or the 403 of an upload that needs the delete
// permission because "an object with the same name already exists" (the
// JSON API's permission table, footnote on objects.insert:
// https://cloud.google.com/storage/docs/access-control/iam-json). So a 403
// is followed by a look at the object (the writers of reports and events
// also read their buckets): an object there is ErrExists, like a 412, and
// only a 403 on a name still free is a refusal.
func (g *GCS) Create(ctx context.Context, bucket, name string, data []byte, contentType string) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	w := g.Client.Bucket(bucket).Object(name).If(storage.Conditions{DoesNotExist: true}).NewWriter(ctx)
	w.ContentType = contentType
	w.ChunkSize = 0 // one request: the content is in memory
	if _, err := w.Write(data); err != nil {
		_ = w.Close()
		return fmt.Errorf("write gs://%s/%s: %w", bucket, name, err)
	}
	err := w.Close()
	var ge *googleapi.Error
	if errors.As(err, &ge) && ge.Code == http.StatusForbidden {
		if _, aerr := g.Client.Bucket(bucket).Object(name).Attrs(ctx); aerr == nil {
			return fmt.Errorf("gs://%s/%s (the upload was refused with 403): %w", bucket, name, ErrExists)
		}
	}
	if errors.As(err, &ge) && ge.Code == http.StatusPreconditionFailed {
		return fmt.Errorf("gs://%s/%s: %w", bucket, name, ErrExists)
	}
	if err != nil {
		return fmt.Errorf("write gs://%s/%s: %w", bucket, name, err)
	}
	return nil
}

// Bucket is a checkpoints.Store over a bucket.
func (g *GCS) Bucket(bucket string) checkpoints.Store { return bucketStore{g, bucket} }

type bucketStore struct {
	g      *GCS
	bucket string
}

func (b bucketStore) List(ctx context.Context, prefix string) ([]string, error) {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	it := b.g.Client.Bucket(b.bucket).Objects(ctx, &storage.Query{Prefix: prefix})
	var out []string
	for {
		a, err := it.Next()
		if errors.Is(err, iterator.Done) {
			return out, nil
		}
		if errors.Is(err, storage.ErrBucketNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, a.Name)
	}
}

func (b bucketStore) Read(ctx context.Context, name string, limit int64) ([]byte, error) {
	data, _, err := b.g.Read(ctx, b.bucket, name, limit)
	return data, err
}

func (b bucketStore) URI(name string) string {
	return "gs://" + b.bucket + "/" + strings.TrimPrefix(name, "/")
}

// PubSub publishes Pub/Sub messages with one publisher per topic.
type PubSub struct {
	Client *pubsub.Client
	mu     sync.Mutex
	pubs   map[string]*pubsub.Publisher
}

// Publish publishes one message and waits for the server's acknowledgement.
func (p *PubSub) Publish(ctx context.Context, topic string, data []byte, attrs map[string]string) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	p.mu.Lock()
	if p.pubs == nil {
		p.pubs = map[string]*pubsub.Publisher{}
	}
	pub, ok := p.pubs[topic]
	if !ok {
		pub = p.Client.Publisher(topic)
		pub.PublishSettings.DelayThreshold = 0
		p.pubs[topic] = pub
	}
	p.mu.Unlock()
	_, err := pub.Publish(ctx, &pubsub.Message{Data: data, Attributes: attrs}).Get(ctx)
	return err
}

// EventarcBus publishes to an Eventarc Advanced message bus through
// Eventarc's publishing client.
type EventarcBus struct{ Client *publishing.PublisherClient }

// Publish publishes json to bus.
func (b *EventarcBus) Publish(ctx context.Context, bus, json string) error {
	ctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	_, err := b.Client.Publish(ctx, &publishingpb.PublishRequest{
		MessageBus: bus,
		Format:     &publishingpb.PublishRequest_JsonMessage{JsonMessage: json},
	})
	return err
}
