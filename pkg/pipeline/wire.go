package pipeline

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"

	container "cloud.google.com/go/container/apiv1"
	"cloud.google.com/go/container/apiv1/containerpb"
	publishing "cloud.google.com/go/eventarc/publishing/apiv1"
	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/storage"
	rayclient "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/raydrop/raydrop/pkg/checkpoints"
	"github.com/raydrop/raydrop/pkg/gcsdoc"
	"github.com/raydrop/raydrop/pkg/logging"
	"github.com/raydrop/raydrop/pkg/runs"
)

// NewDeps builds the production dependencies from the environment: the
// Cloud Storage and Pub/Sub clients (which honour STORAGE_EMULATOR_HOST and
// PUBSUB_EMULATOR_HOST) and the Kubernetes clients for the GKE cluster or
// the kubeconfig.
func NewDeps(ctx context.Context) (*Deps, error) {
	log := logging.New(os.Stdout, slog.LevelInfo)
	cfg, err := LoadConfig(nil)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfiguration, err)
	}
	gcs, err := storage.NewClient(ctx)
	if err != nil {
		return nil, fmt.Errorf("storage client: %w", err)
	}
	ps, err := pubsub.NewClient(ctx, cfg.Project)
	if err != nil {
		return nil, fmt.Errorf("pubsub client: %w", err)
	}
	rc, err := kubeConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	ray, err := rayclient.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kuberay client: %w", err)
	}
	kube, err := corev1client.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kubernetes client: %w", err)
	}
	bus, err := newBus(ctx, cfg)
	if err != nil {
		return nil, err
	}
	bucket := gcs.Bucket(cfg.StateBucket)
	return &Deps{
		Config:      cfg,
		Runs:        &runs.Store{Bucket: bucket},
		Objects:     &GCS{Client: gcs},
		Publisher:   &PubSub{Client: ps},
		Bus:         bus,
		StateBucket: bucket,
		Leases:      &Leases{Bucket: bucket},
		Ray:         ray,
		Kube:        kube,
		Log:         log,
	}, nil
}

// PublishingEndpointEnv points the Eventarc publishing client at another
// endpoint, as the local cloud's bus: plain gRPC, no credentials. Eventarc
// has no emulator, so no variable of Google's does this.
const PublishingEndpointEnv = "RAYDROP_EVENTARC_PUBLISHING_ENDPOINT"

// newBus is the message bus's publisher; nil when the deployment names no
// bus.
func newBus(ctx context.Context, cfg Config) (Bus, error) {
	if cfg.EventBus == "" {
		return nil, nil
	}
	var opts []option.ClientOption
	if ep := os.Getenv(PublishingEndpointEnv); ep != "" {
		opts = append(opts, option.WithEndpoint(ep), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	}
	c, err := publishing.NewPublisherClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("eventarc publishing client: %w", err)
	}
	return &EventarcBus{Client: c}, nil
}

// Client-side rate limits of the Kubernetes clients. client-go's defaults
// (5 requests/s, bursts of 10) are made for one controller per cluster; a
// function instance serves many events at once, and at 5/s its handlers
// queue behind each other (100 concurrent deliveries took 20 s on the local
// cloud). The API server's own priority and fairness protects it.
const (
	kubeQPS   = 100
	kubeBurst = 200
)

func kubeConfig(ctx context.Context, cfg Config) (*rest.Config, error) {
	rc, err := kubeConfigFor(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = kubeQPS, kubeBurst
	rc.Timeout = CallTimeout
	return rc, nil
}

func kubeConfigFor(ctx context.Context, cfg Config) (*rest.Config, error) {
	if cfg.Kubeconfig != "" {
		rc, err := clientcmd.BuildConfigFromFlags("", cfg.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("%w: kubeconfig %s: %w", ErrConfiguration, cfg.Kubeconfig, err)
		}
		return rc, nil
	}
	cm, err := container.NewClusterManagerClient(ctx)
	if err != nil {
		return nil, fmt.Errorf("container client: %w", err)
	}
	defer func() { _ = cm.Close() }()
	gctx, cancel := context.WithTimeout(ctx, CallTimeout)
	defer cancel()
	c, err := cm.GetCluster(gctx, &containerpb.GetClusterRequest{Name: cfg.GKECluster})
	if err != nil {
		return nil, fmt.Errorf("get GKE cluster %s: %w", cfg.GKECluster, err)
	}
	ep, err := GKEEndpoint(c)
	if err != nil {
		return nil, err
	}
	ts, err := google.DefaultTokenSource(ctx, "https://www.googleapis.com/auth/cloud-platform")
	if err != nil {
		return nil, fmt.Errorf("credentials for GKE: %w", err)
	}
	return &rest.Config{
		Host:            ep.Host,
		TLSClientConfig: rest.TLSClientConfig{CAData: ep.CA},
		WrapTransport: func(rt http.RoundTripper) http.RoundTripper {
			return &oauth2.Transport{Source: ts, Base: rt}
		},
	}, nil
}

// GCS implements Objects over Cloud Storage.
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

// PubSub implements Publisher with one publisher per topic.
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

// ErrConfiguration marks an error in the function's configuration: no
// retry fixes it, only a new deployment.
var ErrConfiguration = errors.New("configuration")

// CallTimeout bounds every single Kubernetes, Cloud Storage and Pub/Sub
// call a handler makes, well inside the functions' 540 s timeout, so a
// call that hangs fails and is retried instead of holding the delivery.
const CallTimeout = gcsdoc.CallTimeout

// Lazy holds an instance's dependencies. They are built on the first event
// (never at import time) and kept once built; a failed build is tried again
// on the next event, except a configuration error, which is kept (only a
// new deployment fixes it). Either way the event is redelivered, not lost.
type Lazy struct {
	Build func(context.Context) (*Deps, error)
	mu    sync.Mutex
	deps  *Deps
	err   error
}

// Get returns the dependencies, building them if needed.
func (l *Lazy) Get(ctx context.Context) (*Deps, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.deps != nil {
		return l.deps, nil
	}
	if l.err != nil {
		return nil, l.err
	}
	d, err := l.Build(ctx)
	if errors.Is(err, ErrConfiguration) {
		l.err = err
	}
	if err != nil {
		return nil, err
	}
	l.deps = d
	return d, nil
}

// Reset drops built dependencies, so the next event builds them again.
func (l *Lazy) Reset() {
	l.mu.Lock()
	l.deps = nil
	l.mu.Unlock()
}

// Default is the process's production dependencies. They outlive the event
// that built them (token sources refresh with the context they were made
// with), so they are built with a context of their own.
var Default = &Lazy{Build: func(context.Context) (*Deps, error) { return NewDeps(context.Background()) }}

// Serve is the body of every function's entry point: it gets the
// dependencies, runs the handler and turns its error into the reply through
// Boundary. After an authentication or TLS failure of the Kubernetes API
// (expired credentials, a rotated control-plane IP or CA) it drops the
// clients, so the next event builds them from the cluster's current
// endpoint and CA.
func Serve(ctx context.Context, function string, deps *Lazy, handle func(context.Context, *Deps) error) error {
	d, err := deps.Get(ctx)
	if err != nil {
		slog.Error("function_not_configured", "function", function, "error", err.Error(), "configuration", errors.Is(err, ErrConfiguration))
		return err
	}
	err = handle(ctx, d)
	if credentialsFailed(err) {
		d.Log.Warn("clients_reset", "function", function, "error", err.Error())
		deps.Reset()
	}
	return Boundary(d.Log, function, err)
}

// credentialsFailed reports whether err is the API server refusing the
// client's credentials, or a TLS handshake that could not verify it.
func credentialsFailed(err error) bool {
	var unknownCA x509.UnknownAuthorityError
	var hostname x509.HostnameError
	var verify *tls.CertificateVerificationError
	return err != nil && (apierrors.IsUnauthorized(err) || errors.As(err, &unknownCA) || errors.As(err, &hostname) || errors.As(err, &verify))
}
