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
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/storage"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"google.golang.org/api/option"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/raydrop/raydrop/infra/localcloud/emulators"
	"github.com/raydrop/raydrop/infra/localcloud/eventarc"
	"github.com/raydrop/raydrop/infra/localcloud/faults"
	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/infra/localcloud/strictgcs"
	"github.com/raydrop/raydrop/pkg/config"
	"github.com/raydrop/raydrop/pkg/names"
	"github.com/raydrop/raydrop/pkg/spec"
	"github.com/raydrop/raydrop/pkg/wiring"
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
	Adapter    *eventarc.Adapter
	// Bus is the deployment's Eventarc Advanced message bus (BusName),
	// which the functions publish every public event to as well.
	Bus *eventarc.Bus
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

	s.step("starting kube-apiserver + etcd with KubeRay's reconcilers (about 15 s)")
	if s.Sim, err = kubesim.Start(ctx, kubesim.Options{Storage: s.GCS, Project: Project, Scenario: s.scenario, Log: o.Log.With("part", "kubesim")}); err != nil {
		return nil, err
	}
	s.Kubeconfig = filepath.Join(o.StateDir, "kubeconfig")
	if err := s.Sim.WriteKubeconfig(s.Kubeconfig); err != nil {
		return nil, err
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

// function is one function's process, run as the Cloud Run functions Go
// runtime would: the buildpack-style binary with FUNCTION_TARGET and PORT.
// A restart (after a crash) listens on the same port, as a new instance
// behind the same service URL.
type function struct {
	name, bin string
	port      int
	env       []string
	logPath   string

	startMu  sync.Mutex // one restart at a time
	mu       sync.Mutex
	cmd      *exec.Cmd
	killed   bool // the current process was killed on purpose
	restarts int
	exits    []string // unexpected exits
}

func (f *function) url() string { return fmt.Sprintf("http://127.0.0.1:%d/", f.port) }

func (s *Stack) newFunction(bin, target string) (*function, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	f := &function{name: target, bin: bin, port: port, logPath: filepath.Join(s.opts.StateDir, strings.ToLower(target)+".log")}
	rt, err := s.kubeTransport(target)
	if err != nil {
		return nil, err
	}
	kubeDoor, err := s.KubeProxy.DoorWith(target, rt)
	if err != nil {
		return nil, err
	}
	gcsDoor, err := s.GCSProxy.Door(target)
	if err != nil {
		return nil, err
	}
	s.holdToGrants(target)
	kubeconfig := filepath.Join(s.opts.StateDir, "kubeconfig-"+strings.ToLower(target))
	if err := writeProxyKubeconfig(kubeconfig, "http://"+kubeDoor); err != nil {
		return nil, err
	}
	cfg := config.Config{
		Project: Project, IntakeBucket: IntakeBucket, StateBucket: StateBucket, Kubeconfig: kubeconfig,
		ScaleDownAge: 30 * time.Second, EventSource: "//raydrop.dev/localcloud",
		OutputBuckets: s.opts.OutputBuckets, DataBuckets: []string{DataBucket}, Namespaces: []string{Namespace},
		EventBus: BusName,
	}
	f.env = append(os.Environ(), "GORACE=halt_on_error=1", "FUNCTION_TARGET="+target, "PORT="+strconv.Itoa(port), "LOCAL_ONLY=true",
		config.PublishingEndpointEnv+"="+s.Bus.Addr())
	f.env = append(f.env, cfg.Env()...)
	door, err := s.openPubSubDoor(target)
	if err != nil {
		return nil, err
	}
	s.pubsubDoors[target] = door
	f.env = append(f.env, "PUBSUB_EMULATOR_HOST="+door.addr)
	f.env = append(f.env, "STORAGE_EMULATOR_HOST="+gcsDoor)
	return f, nil
}

// writeProxyKubeconfig writes a kubeconfig for the proxy's plain-HTTP door
// (the door holds the function's own credentials).
func writeProxyKubeconfig(path, server string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["local"] = &clientcmdapi.Cluster{Server: server}
	cfg.AuthInfos["function"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["local"] = &clientcmdapi.Context{Cluster: "local", AuthInfo: "function"}
	cfg.CurrentContext = "local"
	return clientcmd.WriteToFile(*cfg, path)
}

// start starts the process and waits until it listens.
func (f *function) start(ctx context.Context) error {
	logf, err := os.OpenFile(f.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	cmd := exec.Command(f.bin)
	cmd.Env = f.env
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		_ = logf.Close()
		return fmt.Errorf("start %s: %w", f.name, err)
	}
	f.mu.Lock()
	f.cmd, f.killed = cmd, false
	f.mu.Unlock()
	go func() {
		err := cmd.Wait()
		_ = logf.Close()
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.cmd == cmd && !f.killed {
			f.exits = append(f.exits, fmt.Sprintf("%s exited: %v (log: %s)", f.name, err, f.logPath))
		}
	}()
	addr := "127.0.0.1:" + strconv.Itoa(f.port)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			_ = c.Close()
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("function %s did not listen on %s within 30 s (log: %s)", f.name, addr, f.logPath)
}

// kill kills the process (and its group) at once.
func (f *function) kill() {
	f.mu.Lock()
	cmd := f.cmd
	f.killed = true
	f.mu.Unlock()
	if cmd != nil && cmd.Process != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
}

// Kill kills a function's process at once, as a crashed instance.
func (s *Stack) Kill(fn string) error {
	f, ok := s.funcs[fn]
	if !ok {
		return fmt.Errorf("no function %q", fn)
	}
	f.kill()
	return nil
}

// Restart starts a killed function again on its port.
func (s *Stack) Restart(ctx context.Context, fn string) error {
	f, ok := s.funcs[fn]
	if !ok {
		return fmt.Errorf("no function %q", fn)
	}
	f.startMu.Lock()
	defer f.startMu.Unlock()
	f.mu.Lock()
	alive := !f.killed
	if !alive {
		f.restarts++
	}
	f.mu.Unlock()
	if alive || s.stopping.Load() {
		return nil // another restart won, or the stack is going away
	}
	return f.start(ctx)
}

// PID is the process ID of a function's current instance (0: none).
func (s *Stack) PID(fn string) int {
	return s.read(fn, func(f *function) int {
		if f.cmd == nil || f.cmd.Process == nil {
			return 0
		}
		return f.cmd.Process.Pid
	})
}

// Restarts counts the restarts of a function's process.
func (s *Stack) Restarts(fn string) int {
	return s.read(fn, func(f *function) int { return f.restarts })
}

// read reads a function's process state under its lock (0: no such function).
func (s *Stack) read(fn string, get func(*function) int) int {
	f, ok := s.funcs[fn]
	if !ok {
		return 0
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return get(f)
}

// URL is a function's URL, where Eventarc posts its events.
func (s *Stack) URL(fn string) string {
	if f, ok := s.funcs[fn]; ok {
		return f.url()
	}
	return ""
}

// Exits lists the function processes that ended without being killed on
// purpose: a crash.
func (s *Stack) Exits() []string {
	var out []string
	for _, f := range s.funcs {
		f.mu.Lock()
		out = append(out, f.exits...)
		f.mu.Unlock()
	}
	return out
}

// Crash is a function process killed mid-handler by a crash plan.
type Crash struct {
	Function string
	// After is the write the process sent last, which the service carried
	// out: "PUT /storage/v1/b/raydrop-intake/o/runs%2F..." and the like.
	After string
	At    time.Time
}

type crashPlan struct {
	fn    string
	left  int
	match func(faults.Request) bool
	fired chan struct{}
	done  chan Crash
}

// CrashAt kills fn's process right after the service carried out its nth
// write (through either proxy) that match accepts (nil: any), before the
// process sees the answer, then restarts it after restartAfter, as Cloud
// Run replaces a crashed instance. The channel gets the crash; cancel
// disarms a plan that has not fired.
func (s *Stack) CrashAt(fn string, nth int, match func(faults.Request) bool, restartAfter time.Duration) (crashed <-chan Crash, cancel func()) {
	p := &crashPlan{fn: fn, left: nth, match: match, fired: make(chan struct{}), done: make(chan Crash, 1)}
	s.crashMu.Lock()
	s.crashes = append(s.crashes, p)
	s.crashMu.Unlock()
	disarmed := make(chan struct{})
	go func() {
		select {
		case <-p.fired:
		case <-disarmed:
			return
		}
		time.Sleep(restartAfter)
		if err := s.Restart(context.Background(), fn); err != nil {
			s.opts.Log.Error("restart after crash", "function", fn, "error", err.Error())
		}
	}()
	var once sync.Once
	return p.done, func() {
		once.Do(func() {
			s.crashMu.Lock()
			defer s.crashMu.Unlock()
			for i, q := range s.crashes {
				if q == p {
					s.crashes = append(s.crashes[:i], s.crashes[i+1:]...)
					close(disarmed)
					return
				}
			}
		})
	}
}

func (s *Stack) crashHook(r faults.Request) {
	if !r.Write || r.Status == 0 {
		return
	}
	s.crashMu.Lock()
	var fire *crashPlan
	for i, p := range s.crashes {
		if p.fn != r.Client || (p.match != nil && !p.match(r)) {
			continue
		}
		if p.left--; p.left == 0 {
			fire = p
			s.crashes = append(s.crashes[:i], s.crashes[i+1:]...)
		}
		break
	}
	s.crashMu.Unlock()
	if fire == nil {
		return
	}
	s.funcs[fire.fn].kill()
	s.opts.Log.Warn("function killed mid-handler", "function", fire.fn, "after", r.Method+" "+r.Path)
	c := Crash{Function: fire.fn, After: r.Method + " " + r.Path, At: time.Now()}
	s.crashMu.Lock()
	s.killed = append(s.killed, c)
	s.crashMu.Unlock()
	fire.done <- c
	close(fire.fired)
}

// Kills lists every crash plan that fired, in order. A kill ends every
// delivery the process was handling, not only the one whose write fired it.
func (s *Stack) Kills() []Crash {
	s.crashMu.Lock()
	defer s.crashMu.Unlock()
	return slices.Clone(s.killed)
}

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
	sc, err := ParseScenario(s.opts.DefaultSim)
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
	parsed, err := ParseScenario(text)
	if err != nil {
		s.opts.Log.Warn("bad_scenario", "object", src, "error", err.Error())
		return sc
	}
	// A lost head is a one-off accident: the retry that follows runs clean.
	if parsed.Outcome == kubesim.LoseHead && job.Labels[names.LabelAttempt] != "1" {
		parsed.Outcome = kubesim.Succeed
	}
	// preempt=3/7: attempt n loses a node at the n-th step listed.
	if at := parsed.PreemptAt; len(at) > 0 {
		n, _ := strconv.Atoi(job.Labels[names.LabelAttempt])
		parsed.Outcome = kubesim.Succeed
		if n >= 1 && n <= len(at) {
			parsed.Outcome, parsed.At = cmp.Or(parsed.PreemptAs, kubesim.Preempt), at[n-1]
		}
	}
	return parsed
}

// parsePreempt reads preempt=3/7: the step each attempt loses a node at.
func parsePreempt(v string) ([]int, error) {
	var at []int
	for _, s := range strings.Split(v, "/") {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 {
			return nil, fmt.Errorf("preempt=%s: %q is not a step (give steps such as preempt=3/7)", v, s)
		}
		at = append(at, n)
	}
	return at, nil
}

// ParseScenario reads "outcome=fail,at=5,steps=4,step=100ms" over the
// default scenario.
func ParseScenario(text string) (kubesim.Scenario, error) {
	sc := kubesim.DefaultScenario()
	if strings.TrimSpace(text) == "" {
		return sc, nil
	}
	for _, kv := range strings.Split(text, ",") {
		k, v, _ := strings.Cut(strings.TrimSpace(kv), "=")
		var err error
		switch k {
		case "outcome":
			sc.Outcome = kubesim.Outcome(v)
		case "at":
			sc.At, err = strconv.Atoi(v)
		case "steps":
			sc.StepsPerEpoch, err = strconv.Atoi(v)
		case "step":
			sc.StepTime, err = time.ParseDuration(v)
		case "pending":
			sc.PendingFor, err = time.ParseDuration(v)
		case "dropped":
			sc.DroppedRows, err = strconv.Atoi(v)
		case "refuse":
			sc.Refuse, err = parseRefuse(v)
		case "preempt":
			sc.PreemptAt, err = parsePreempt(v)
		case "preemptAs":
			switch o := kubesim.Outcome(v); o {
			case kubesim.Preempt, kubesim.Reclaim, kubesim.ReclaimInSave:
				sc.PreemptAs = o
			default:
				err = fmt.Errorf("preemptAs=%s: allowed: preempt (the save on notice ends), reclaim (the node goes mid-step), reclaim-in-save (the node goes during the save)", v)
			}
		default:
			err = fmt.Errorf("unknown key %q (allowed: outcome, at, steps, step, pending, dropped, refuse, preempt, preemptAs)", k)
		}
		if err != nil {
			return sc, fmt.Errorf("scenario %q: %w", text, err)
		}
	}
	return sc, nil
}

// parseRefuse reads refuse=reservation:20s/flexStart: the capacity tiers
// with no nodes, each for how long (none: for the whole job).
func parseRefuse(v string) (map[string]time.Duration, error) {
	out := map[string]time.Duration{}
	for _, item := range strings.Split(v, "/") {
		tier, d, timed := strings.Cut(item, ":")
		switch tier {
		case spec.TierReservation, spec.TierFlexStart, spec.TierSpot, spec.TierOnDemand:
		default:
			return nil, fmt.Errorf("refuse: unknown capacity tier %q (allowed: reservation, flexStart, spot, onDemand)", tier)
		}
		out[tier] = 0
		if timed {
			dur, err := time.ParseDuration(d)
			if err != nil || dur <= 0 {
				return nil, fmt.Errorf("refuse: %s:%s is not a positive duration", tier, d)
			}
			out[tier] = dur
		}
	}
	return out, nil
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
		var errs []error
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
