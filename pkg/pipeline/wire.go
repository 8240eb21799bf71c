package pipeline

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"sync"

	container "cloud.google.com/go/container/apiv1"
	"cloud.google.com/go/container/apiv1/containerpb"
	publishing "cloud.google.com/go/eventarc/publishing/apiv1"
	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/storage"
	rayclient "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned"
	"golang.org/x/oauth2"
	"golang.org/x/oauth2/google"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/gcp"
	"github.com/raydrop/raydrop/pkg/gcsdoc"
	"github.com/raydrop/raydrop/pkg/logging"
	"github.com/raydrop/raydrop/pkg/runs"
	"github.com/raydrop/raydrop/pkg/sweeps"
)

// NewDeps builds the production dependencies from the environment: the
// Cloud Storage and Pub/Sub clients (which honour STORAGE_EMULATOR_HOST and
// PUBSUB_EMULATOR_HOST) and the Kubernetes clients for the GKE cluster or
// the kubeconfig.
func NewDeps(ctx context.Context) (*Deps, error) {
	log := logging.New(os.Stdout, slog.LevelInfo)
	cfg, err := config.LoadConfig(nil)
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
	return Assemble(cfg, Clients{
		GCS: gcs, Publisher: &gcp.PubSub{Client: ps}, Bus: bus, Ray: ray, Kube: kube, Log: log,
	}), nil
}

// Clients are what the dependencies are built over: the services' clients,
// the logger and the clock.
type Clients struct {
	GCS       *storage.Client
	Publisher Publisher
	Bus       Bus // nil: no message bus
	Ray       rayclient.Interface
	Kube      corev1client.CoreV1Interface
	Log       *slog.Logger
	Clock     runs.Clock // nil: the system clock
}

// Assemble builds the dependencies over c: every store on the state bucket,
// sharing one clock. It is the one place the dependencies are put together:
// the deployed functions (NewDeps), the local cloud's benchmark and the
// handler tables all build them here, so a dependency cannot be missing in
// one of them only.
func Assemble(cfg config.Config, c Clients) *Deps {
	bucket := c.GCS.Bucket(cfg.StateBucket)
	return &Deps{
		Config:      cfg,
		Runs:        &runs.Store{Bucket: bucket, Clock: c.Clock},
		Sweeps:      &sweeps.Store{Bucket: bucket, Clock: c.Clock},
		Objects:     &gcp.GCS{Client: c.GCS},
		Publisher:   c.Publisher,
		Bus:         c.Bus,
		StateBucket: bucket,
		Leases:      &Leases{Bucket: bucket, Clock: c.Clock},
		Ray:         c.Ray,
		Kube:        c.Kube,
		Log:         c.Log,
		Clock:       c.Clock,
	}
}

// newBus is the message bus's publisher; nil when the deployment names no
// bus.
func newBus(ctx context.Context, cfg config.Config) (Bus, error) {
	if cfg.EventBus == "" {
		return nil, nil
	}
	var opts []option.ClientOption
	if ep := os.Getenv(config.PublishingEndpointEnv); ep != "" {
		opts = append(opts, option.WithEndpoint(ep), option.WithoutAuthentication(),
			option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	}
	c, err := publishing.NewPublisherClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("eventarc publishing client: %w", err)
	}
	return &gcp.EventarcBus{Client: c}, nil
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

func kubeConfig(ctx context.Context, cfg config.Config) (*rest.Config, error) {
	rc, err := kubeConfigFor(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rc.QPS, rc.Burst = kubeQPS, kubeBurst
	rc.Timeout = CallTimeout
	return rc, nil
}

func kubeConfigFor(ctx context.Context, cfg config.Config) (*rest.Config, error) {
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
	ep, err := gcp.GKEEndpoint(c)
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
