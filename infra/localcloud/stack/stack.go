// Package stack starts raydrop's local cloud: the Pub/Sub emulator,
// fake-gcs-server with object notifications, a real kube-apiserver with
// KubeRay's own reconcilers and the kubelet/Job simulators, the Eventarc
// adapter delivering each trigger's subscription with the deployment's
// concurrency and retry policy (DeliveryPolicy), the four functions each
// in its own process exactly as deployed, and a scheduler ticker.
//
// The functions reach the API server and Cloud Storage through the
// recording, fault-injecting proxies of package faults (KubeProxy,
// GCSProxy), one door per function, so tests count what each function asks
// of the services and inject conflicts, outages and crashes mid-handler.
// Every client of Cloud Storage, the functions' doors and the harness's own
// client (GCS) alike, reaches fake-gcs-server through one strictgcs.Gate,
// which keeps metagenerations and enforces the preconditions
// fake-gcs-server ignores.
package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/storage"
	"google.golang.org/api/option"
	"k8s.io/client-go/rest"

	"github.com/raydrop/raydrop/infra/localcloud/emulators"
	"github.com/raydrop/raydrop/infra/localcloud/eventarc"
	"github.com/raydrop/raydrop/infra/localcloud/faults"
	"github.com/raydrop/raydrop/infra/localcloud/hub"
	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/infra/localcloud/kueue"
	"github.com/raydrop/raydrop/infra/localcloud/strictgcs"
	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/wiring"
	"github.com/raydrop/raydrop/trainer"
)

// Names of the local deployment.
const (
	Project      = "raydrop-local"
	IntakeBucket = "raydrop-intake"
	// StateBucket holds the run records and cluster leases; no trigger
	// listens to it.
	StateBucket = "raydrop-state"
	// DataBucket is the deployment's data bucket: a spec's dataset.source
	// may name it (RAYDROP_DATA_BUCKETS), and no other.
	DataBucket = "raydrop-local-data"
	// BusName is the Eventarc Advanced message bus the functions publish
	// their public events to as well (RAYDROP_EVENT_BUS).
	BusName = "projects/" + Project + "/locations/us-central1/messageBuses/raydrop-events"
	// NotifyTopic carries fake-gcs-server's object notifications, as the
	// topic behind an Eventarc storage trigger does.
	NotifyTopic = "raydrop-gcs-notifications"
	// SimMetadata is the custom metadata key of a spec object that says how
	// its simulated Ray job plays, e.g. "outcome=fail,at=5,steps=4,step=100ms".
	SimMetadata = "raydrop-sim"
)

// Topics of the deployment, as the functions' defaults name them.
var Topics = wiring.DefaultTopics()

// TrainerImage is the local cloud's trainer image (RAYDROP_TRAINER_IMAGE).
// Simulated: nothing here builds or pulls an image, and kubesim's pods run
// no container. It is named by a digest of trainer/image's files
// (trainer.ImageDigest), so it changes when the real image would, and the
// pipeline treats it as a deployment's image: admitted runs name it and
// their runtime env installs nothing.
var TrainerImage = "localhost/raydrop/trainer@" + trainer.ImageDigest()

// HubModels are the model repositories the local Hugging Face Hub holds,
// each a stand-in snapshot (hub.Snapshot); it holds the tutorial's
// dataset too, a small copy of its shape (hub.TutorialDataset).
var HubModels = []string{"google/gemma-3-4b-it", "google/gemma-3-12b-it", "google/gemma-3-27b-it"}

// GatedDataset is a gated dataset of the local Hub: a copy of the tutorial's
// whose files it serves to no token the local cloud has, as the Hub serves
// a gated dataset whose terms the deployment's account has not accepted.
const GatedDataset = "raydrop/gated-product-descriptions"

// ModelStagingPrefix is where, in the first output bucket, the local cloud
// stages base models (RAYDROP_MODEL_STAGING).
const ModelStagingPrefix = "models"

// BuildEnv is the build environment of the deployed functions (the build
// environment variables in infra/gcp/functions.tf): Cloud Storage's
// documented build tag that leaves out its gRPC client, which the functions
// do not use.
var BuildEnv = []string{"GOFLAGS=-tags=disable_grpc_modules"}

// Options configure the stack.
type Options struct {
	Repo          string        // repository root (builds cmd/functions from it)
	StateDir      string        // logs, kubeconfig, binaries (default: a temporary folder)
	Tick          time.Duration // scheduler interval (default 5s)
	OutputBuckets []string      // checkpoint buckets whose completion marks reach Monitor
	// DefaultSim is the scenario of runs whose spec object names none
	// (see SimMetadata); empty: kubesim's default.
	DefaultSim string
	Log        *slog.Logger
	// Progress, when set, receives one line per start-up step.
	Progress io.Writer
	// Race builds the functions with the race detector, which ends a
	// function's process at the first data race it sees (Exits lists it):
	// the handlers serve many events at once, as deployed.
	Race bool
	// Subscriber deploys the example subscriber (examples/subscriber) with
	// a trigger on the events topic, promoting into ModelsBucket.
	Subscriber bool
	// Kueue runs Kueue's controller manager (package kueue) against the
	// API server, beside KubeRay's reconcilers, its log in the state
	// folder's kueue/kueue.log.
	Kueue bool
}

// Stack is a running local cloud.
type Stack struct {
	// RouteNames are Eventarc's routes, one per trigger (and per checkpoint
	// bucket for the completion marks), as the wiring table makes them.
	RouteNames []string
	opts       Options
	PubSub     *emulators.PubSub
	Storage    *emulators.Storage
	Sim        *kubesim.Sim
	// Kueue is the running Kueue (nil without Options.Kueue).
	Kueue   *kueue.Kueue
	Adapter *eventarc.Adapter
	// Bus is the deployment's Eventarc Advanced message bus (BusName),
	// which the functions publish every public event to as well.
	Bus *eventarc.Bus
	// Hub is the local cloud's Hugging Face Hub (package hub), holding
	// HubModels: the functions resolve model revisions there, and the
	// trainer stand-in stages them from it.
	Hub *hub.Hub
	// GCS is the harness's own client of Cloud Storage: through the
	// strict gate (StrictGCS), without the functions' doors and faults.
	GCS *storage.Client
	// StrictGCS keeps metagenerations and enforces the preconditions
	// fake-gcs-server does not, for every client (package strictgcs).
	StrictGCS  *strictgcs.Gate
	gcsHost    string // StrictGCS's own listener, host:port
	closeGCS   func()
	PS         *pubsub.Client
	Kubeconfig string
	// KubeProxy and GCSProxy stand between the functions and the API
	// server and fake-gcs-server.
	KubeProxy *faults.Proxy
	GCSProxy  *faults.Proxy
	funcs     map[string]*function
	// pubsubDoors hold each function to the topics it may publish to.
	pubsubDoors map[string]*pubsubDoor
	crashMu     sync.Mutex
	crashes     []*crashPlan
	killed      []Crash // every crash plan that fired
	paused      atomic.Bool
	stopping    atomic.Bool
	ownState    bool // StateDir was made by Start: removed by Stop unless kept
	keepState   bool
	cancel      context.CancelFunc
	wg          sync.WaitGroup
	stopOnce    sync.Once
}

// Env is the environment that points tools and clients at the stack.
func (s *Stack) Env() []string {
	env := append(s.PubSub.Env(), "STORAGE_EMULATOR_HOST="+s.gcsHost)
	env = append(env, "KUBECONFIG="+s.Kubeconfig)
	return append(env, config.Config{Project: Project, IntakeBucket: IntakeBucket, StateBucket: StateBucket, Kubeconfig: s.Kubeconfig}.Env()...)
}

func (s *Stack) step(format string, args ...any) {
	if s.opts.Progress != nil {
		fmt.Fprintf(s.opts.Progress, "localcloud: "+format+"\n", args...)
	}
}

// Start brings the whole stack up; on any error it stops what it started.
func Start(ctx context.Context, o Options) (st *Stack, err error) {
	if o.Tick == 0 {
		o.Tick = 5 * time.Second
	}
	if o.Log == nil {
		o.Log = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	own := o.StateDir == ""
	if own {
		if o.StateDir, err = os.MkdirTemp("", "raydrop-localcloud-"); err != nil {
			return nil, err
		}
	}
	s := &Stack{opts: o, ownState: own}
	defer func() {
		if err != nil {
			s.KeepState()
			s.Stop()
			err = fmt.Errorf("%w (logs in %s)", err, o.StateDir)
		}
	}()
	t0 := time.Now()
	bin := filepath.Join(o.StateDir, "functions")
	s.step("building the functions from %s (as the Go buildpack does)", o.Repo)
	args := []string{"build", "-o", bin}
	if o.Race {
		args = append(args, "-race")
	}
	build := exec.CommandContext(ctx, "go", append(args, "./cmd/functions")...)
	build.Dir = o.Repo
	build.Env = append(os.Environ(), BuildEnv...)
	if out, err := build.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build functions: %w\n%s", err, out)
	}

	s.step("starting the Pub/Sub emulator")
	if s.PubSub, err = emulators.StartPubSub(ctx, Project, o.StateDir); err != nil {
		return nil, err
	}
	if s.PS, err = s.PubSub.NewClient(ctx); err != nil {
		return nil, err
	}
	topics := []string{NotifyTopic}
	for _, k := range wiring.TopicKeys {
		topics = append(topics, Topics.Name(k))
	}
	if err := s.PubSub.CreateTopics(ctx, topics...); err != nil {
		return nil, err
	}
	fake, err := emulators.FakeGCSBinary()
	if err != nil {
		return nil, err
	}
	s.step("starting fake-gcs-server with notifications to %s", NotifyTopic)
	if s.Storage, err = emulators.StartStorage(ctx, fake, s.PubSub, NotifyTopic, o.StateDir); err != nil {
		return nil, err
	}
	if s.StrictGCS, err = strictgcs.New(s.Storage.URL()); err != nil {
		return nil, err
	}
	if s.gcsHost, s.closeGCS, err = s.StrictGCS.Serve(); err != nil {
		return nil, err
	}
	if s.GCS, err = storage.NewClient(ctx, option.WithEndpoint("http://"+s.gcsHost+"/storage/v1/"), option.WithoutAuthentication()); err != nil {
		return nil, err
	}
	for _, b := range append([]string{IntakeBucket, StateBucket, DataBucket}, o.OutputBuckets...) {
		if err := s.GCS.Bucket(b).Create(ctx, Project, nil); err != nil && !strings.Contains(err.Error(), "409") {
			return nil, fmt.Errorf("create bucket %s: %w", b, err)
		}
	}

	repos := hub.Repos{Models: map[string]map[string][]byte{},
		Datasets: map[string]map[string][]byte{hub.TutorialDatasetID: hub.TutorialDataset(), GatedDataset: hub.TutorialDataset()},
		Gated:    map[string]string{hub.Datasets + "/" + GatedDataset: "hf_granted_to_nobody_here"}}
	for _, id := range HubModels {
		repos.Models[id] = hub.Snapshot(id, 256<<10)
	}
	if s.Hub, err = hub.Start(repos); err != nil {
		return nil, err
	}
	s.step("serving the models %s and the dataset %s at a local Hugging Face Hub, %s", strings.Join(HubModels, ", "), hub.TutorialDatasetID, s.Hub.URL())

	s.step("starting kube-apiserver + etcd with KubeRay's reconcilers (about 15 s)")
	python, err := TrainerPython()
	if err != nil {
		return nil, err
	}
	if s.Sim, err = kubesim.Start(ctx, kubesim.Options{Storage: s.GCS, StorageHost: s.gcsHost, Python: python, Project: Project, Scenario: s.scenario, Hub: s.Hub.URL(), Kueue: o.Kueue, Log: o.Log.With("part", "kubesim")}); err != nil {
		return nil, err
	}
	s.Kubeconfig = filepath.Join(o.StateDir, "kubeconfig")
	if err := s.Sim.WriteKubeconfig(s.Kubeconfig); err != nil {
		return nil, err
	}

	if o.Kueue {
		s.step("starting Kueue %s: its controller manager, CRDs and webhooks (log in %s)", kueue.Version, filepath.Join(o.StateDir, "kueue", "kueue.log"))
		if s.Kueue, err = kueue.Start(ctx, kueue.Options{Config: s.Sim.Config, Kubeconfig: s.Kubeconfig, Dir: filepath.Join(o.StateDir, "kueue"), Log: o.Log.With("part", "kueue")}); err != nil {
			return nil, err
		}
	}

	rt, err := rest.TransportFor(s.Sim.Config)
	if err != nil {
		return nil, err
	}
	if s.KubeProxy, err = faults.New("kube-apiserver", s.Sim.Config.Host, rt); err != nil {
		return nil, err
	}
	if s.GCSProxy, err = faults.New("fake-gcs-server", s.Storage.URL(), nil); err != nil {
		return nil, err
	}
	s.limitObjectWrites()
	s.GCSProxy.SetGate(s.StrictGCS.Handle)
	hook := func(r faults.Request) { s.crashHook(r) }
	s.KubeProxy.SetHook(hook)
	s.GCSProxy.SetHook(hook)

	if s.Bus, err = eventarc.StartBus(BusName); err != nil {
		return nil, err
	}

	s.step("granting each function's identity its Role (RBAC) and bucket roles")
	if err := s.grantAll(ctx); err != nil {
		return nil, err
	}

	s.step("starting the four functions, each in its own process")
	targets := map[string]string{}
	s.funcs = map[string]*function{}
	s.pubsubDoors = map[string]*pubsubDoor{}
	for _, fn := range Functions {
		f, err := s.newFunction(bin, fn)
		if err != nil {
			return nil, err
		}
		if err := f.start(ctx); err != nil {
			return nil, err
		}
		s.funcs[fn] = f
		targets[fn] = f.url()
	}

	routes, topicOf := s.routes(targets)
	if o.Subscriber {
		s.step("starting the example subscriber (examples/subscriber) on the events topic")
		r, err := s.startSubscriber(ctx)
		if err != nil {
			return nil, err
		}
		routes = append(routes, r)
		topicOf[r.Name] = Topics.Name(wiring.TopicEvents)
	}
	for _, r := range routes {
		s.RouteNames = append(s.RouteNames, r.Name)
	}
	s.Adapter = eventarc.New(routes, o.Log.With("part", "eventarc"), nil)
	if _, err := s.Adapter.Start(ctx); err != nil {
		return nil, err
	}
	s.step("creating the triggers' subscriptions (up to %d deliveries at once each, retry %v..%v, dead-letter after %d attempts)",
		DeliveryPolicy.Concurrency, DeliveryPolicy.MinBackoff, DeliveryPolicy.MaxBackoff, DeliveryPolicy.MaxDeliveryAttempts)
	for _, r := range routes {
		t := emulators.Trigger{Name: r.Name, Topic: topicOf[r.Name], AckDeadline: DeliveryPolicy.AckDeadline}
		if err := s.PubSub.CreateTriggerSubscription(ctx, t); err != nil {
			return nil, err
		}
	}

	tctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for _, r := range routes {
		pol := DeliveryPolicy
		pol.DeadLetterTopic = emulators.DeadLetterTopic(s.PubSub.TopicName(topicOf[r.Name]))
		s.wg.Go(func() {
			if err := s.Adapter.Receive(tctx, r.Name, s.PubSub.SubscriptionName(r.Name), pol, s.PubSub.Subscriber(), s.PubSub.Forward); err != nil {
				o.Log.Error("eventarc: a trigger stopped receiving", "route", r.Name, "err", err)
			}
		})
	}
	if err := s.markNotifications(tctx); err != nil {
		return nil, err
	}
	s.wg.Add(1)
	go s.ticker(tctx, o.Tick)
	s.step("ready in %.1f s", time.Since(t0).Seconds())
	return s, nil
}

// DeliveryPolicy is how the local Eventarc delivers each trigger's events
// (eventarc.Policy): as many at once as the deployment's defaults allow
// (function_max_instances 10 × function_concurrency 16 in
// infra/gcp/variables.tf), max_delivery_attempts' default, and the retry
// back-off scaled down from the deployment's 10 s..600 s
// (infra/gcp/functions.tf) so the suites see retries within seconds.
var DeliveryPolicy = eventarc.Policy{
	Concurrency:         10 * 16,
	AckDeadline:         60 * time.Second,
	MinBackoff:          time.Second,
	MaxBackoff:          10 * time.Second,
	MaxDeliveryAttempts: 10,
}

// Functions are the functions' entry points (wiring.Functions).
var Functions = func() []string {
	var out []string
	for _, f := range wiring.Functions {
		out = append(out, f.EntryPoint)
	}
	return out
}()

// routes are Eventarc's routes of the wiring table (wiring.Functions), to
// the functions' targets by entry point, with the topic each route's
// subscription reads: a Pub/Sub trigger's own topic, or the topic of the
// intake bucket's object notifications. (The checkpoint buckets reach
// Monitor through the marks topic: markNotifications.)
func (s *Stack) routes(targets map[string]string) ([]eventarc.Route, map[string]string) {
	var routes []eventarc.Route
	topicOf := map[string]string{}
	for _, f := range wiring.Functions {
		target := targets[f.EntryPoint]
		for _, tr := range f.Triggers {
			switch tr.Bucket {
			case "":
				routes = append(routes, eventarc.Route{Name: tr.Name, Kind: eventarc.PubSubPublished, Target: target, Topic: s.PubSub.TopicName(Topics.Name(tr.Topic))})
				topicOf[tr.Name] = Topics.Name(tr.Topic)
			case wiring.BucketIntake:
				routes = append(routes, eventarc.Route{Name: tr.Name, Kind: eventarc.StorageFinalized, Target: target, Bucket: IntakeBucket})
				topicOf[tr.Name] = NotifyTopic
			}
		}
	}
	return routes, topicOf
}

// RouteFunction is the entry point of the function a route delivers to
// ("" for a route the wiring table does not have).
func RouteFunction(route string) string {
	for _, f := range wiring.Functions {
		for _, tr := range f.Triggers {
			if tr.Name == route {
				return f.EntryPoint
			}
		}
	}
	return ""
}

// StateDir is the folder of the stack's logs and kubeconfig.
func (s *Stack) StateDir() string { return s.opts.StateDir }

// KeepState keeps the state folder (logs) after Stop, for a failure to be
// looked into.
func (s *Stack) KeepState() { s.keepState = true }

// Stop stops everything the stack started, functions first.
func (s *Stack) Stop() {
	s.stopOnce.Do(func() {
		s.stopping.Store(true)
		if s.cancel != nil {
			s.cancel()
			s.wg.Wait()
		}
		for _, f := range s.funcs {
			f.kill()
		}
		if s.Bus != nil {
			s.Bus.Stop()
		}
		if s.Adapter != nil {
			_ = s.Adapter.Close()
		}
		for _, p := range []*faults.Proxy{s.KubeProxy, s.GCSProxy} {
			if p != nil {
				p.Close()
			}
		}
		for _, d := range s.pubsubDoors {
			d.close()
		}
		if s.closeGCS != nil {
			s.closeGCS()
		}
		if s.Hub != nil {
			_ = s.Hub.Close()
		}
		var errs []error
		if s.Kueue != nil {
			errs = append(errs, s.Kueue.Stop())
		}
		if s.Sim != nil {
			errs = append(errs, s.Sim.Stop())
		}
		if s.PS != nil {
			_ = s.PS.Close()
		}
		if s.Storage != nil {
			errs = append(errs, s.Storage.Stop())
		}
		if s.PubSub != nil {
			errs = append(errs, s.PubSub.Stop())
		}
		if err := errors.Join(errs...); err != nil {
			s.opts.Log.Warn("stop", "error", err.Error())
		}
		if s.ownState && !s.keepState {
			_ = os.RemoveAll(s.opts.StateDir)
		}
	})
}
