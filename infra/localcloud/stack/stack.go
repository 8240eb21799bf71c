// Package stack starts raydrop's local cloud: the Pub/Sub emulator,
// fake-gcs-server with object notifications, a real kube-apiserver with
// KubeRay's own reconcilers and the kubelet/Job simulators, the Eventarc
// adapter with the deployment's push subscriptions, the four functions each
// in its own process exactly as deployed, and a scheduler ticker.
package stack

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/storage"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"

	"github.com/raydrop/raydrop/infra/localcloud/emulators"
	"github.com/raydrop/raydrop/infra/localcloud/eventarc"
	"github.com/raydrop/raydrop/infra/localcloud/kubesim"
	"github.com/raydrop/raydrop/pkg/names"
)

// Names of the local deployment.
const (
	Project      = "raydrop-local"
	IntakeBucket = "raydrop-intake"
	// NotifyTopic carries fake-gcs-server's object notifications, as the
	// topic behind an Eventarc storage trigger does.
	NotifyTopic = "raydrop-gcs-notifications"
	// SimMetadata is the custom metadata key of a spec object that says how
	// its simulated Ray job plays, e.g. "outcome=fail,at=5,steps=4,step=100ms".
	SimMetadata = "raydrop-sim"
)

// Topics of the deployment, as the functions' defaults name them.
var Topics = struct{ Requests, Provisioned, Submitted, Ticks, Finished, Events string }{
	"raydrop-requests", "raydrop-provisioned", "raydrop-submitted", "raydrop-ticks", "raydrop-finished", "raydrop-events",
}

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
}

// Stack is a running local cloud.
type Stack struct {
	opts       Options
	PubSub     *emulators.PubSub
	Storage    *emulators.Storage
	Sim        *kubesim.Sim
	Adapter    *eventarc.Adapter
	GCS        *storage.Client
	PS         *pubsub.Client
	Kubeconfig string
	funcs      []*exec.Cmd
	ownState   bool // StateDir was made by Start: removed by Stop unless kept
	keepState  bool
	cancel     context.CancelFunc
	wg         sync.WaitGroup
	stopOnce   sync.Once
}

// Env is the environment that points tools and clients at the stack.
func (s *Stack) Env() []string {
	env := append(s.PubSub.Env(), s.Storage.Env()...)
	return append(env, "KUBECONFIG="+s.Kubeconfig, "RAYDROP_PROJECT="+Project, "RAYDROP_INTAKE_BUCKET="+IntakeBucket, "RAYDROP_KUBECONFIG="+s.Kubeconfig)
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
	build := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/functions")
	build.Dir = o.Repo
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
	if err := s.PubSub.CreateTopics(ctx, Topics.Requests, Topics.Provisioned, Topics.Submitted, Topics.Ticks, Topics.Finished, Topics.Events, NotifyTopic); err != nil {
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
	if s.GCS, err = s.Storage.NewClient(ctx); err != nil {
		return nil, err
	}
	for _, b := range append([]string{IntakeBucket}, o.OutputBuckets...) {
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

	s.step("starting the four functions, each in its own process")
	targets := map[string]string{}
	for _, fn := range []string{"Provision", "Submit", "Monitor", "Finalize"} {
		url, err := s.startFunction(ctx, bin, fn)
		if err != nil {
			return nil, err
		}
		targets[fn] = url
	}

	routes := []eventarc.Route{
		{Name: "provision-intake", Kind: eventarc.StorageFinalized, Target: targets["Provision"], Bucket: IntakeBucket},
		{Name: "provision-requests", Kind: eventarc.PubSubPublished, Target: targets["Provision"], Topic: s.PubSub.TopicName(Topics.Requests)},
		{Name: "submit", Kind: eventarc.PubSubPublished, Target: targets["Submit"], Topic: s.PubSub.TopicName(Topics.Provisioned)},
		{Name: "monitor-submitted", Kind: eventarc.PubSubPublished, Target: targets["Monitor"], Topic: s.PubSub.TopicName(Topics.Submitted)},
		{Name: "monitor-ticks", Kind: eventarc.PubSubPublished, Target: targets["Monitor"], Topic: s.PubSub.TopicName(Topics.Ticks)},
		{Name: "finalize", Kind: eventarc.PubSubPublished, Target: targets["Finalize"], Topic: s.PubSub.TopicName(Topics.Finished)},
	}
	for _, b := range o.OutputBuckets {
		routes = append(routes, eventarc.Route{Name: "monitor-marks-" + b, Kind: eventarc.StorageFinalized, Target: targets["Monitor"], Bucket: b})
	}
	s.Adapter = eventarc.New(routes, o.Log.With("part", "eventarc"), nil)
	if _, err := s.Adapter.Start(ctx); err != nil {
		return nil, err
	}
	topicOf := map[string]string{
		"provision-intake": NotifyTopic, "provision-requests": Topics.Requests, "submit": Topics.Provisioned,
		"monitor-submitted": Topics.Submitted, "monitor-ticks": Topics.Ticks, "finalize": Topics.Finished,
	}
	for _, b := range o.OutputBuckets {
		topicOf["monitor-marks-"+b] = NotifyTopic
	}
	s.step("creating the push subscriptions (retry 1s..10s, dead-letter after 10 attempts)")
	for _, r := range routes {
		t := emulators.Trigger{Name: r.Name, Topic: topicOf[r.Name], PushEndpoint: s.Adapter.PushEndpoint(r.Name), AckDeadline: 60 * time.Second, MinBackoff: time.Second, MaxBackoff: 10 * time.Second, MaxDeliveryAttempts: 10}
		if err := s.PubSub.CreatePushSubscription(ctx, t); err != nil {
			return nil, err
		}
	}

	tctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go s.ticker(tctx, o.Tick)
	s.step("ready in %.1f s", time.Since(t0).Seconds())
	return s, nil
}

// startFunction runs one function as the Cloud Run functions Go runtime
// would: the buildpack-style binary with FUNCTION_TARGET and PORT.
func (s *Stack) startFunction(ctx context.Context, bin, target string) (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	logf, err := os.Create(filepath.Join(s.opts.StateDir, strings.ToLower(target)+".log"))
	if err != nil {
		return "", err
	}
	cmd := exec.Command(bin)
	cmd.Env = append(os.Environ(), "FUNCTION_TARGET="+target, "PORT="+strconv.Itoa(port), "LOCAL_ONLY=true",
		"RAYDROP_PROJECT="+Project, "RAYDROP_INTAKE_BUCKET="+IntakeBucket, "RAYDROP_KUBECONFIG="+s.Kubeconfig,
		"RAYDROP_SCALE_DOWN_GRACE=30s", "RAYDROP_EVENT_SOURCE=//raydrop.dev/localcloud")
	cmd.Env = append(cmd.Env, s.PubSub.Env()...)
	cmd.Env = append(cmd.Env, s.Storage.Env()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return "", fmt.Errorf("start %s: %w", target, err)
	}
	s.funcs = append(s.funcs, cmd)
	addr := "127.0.0.1:" + strconv.Itoa(port)
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			_ = c.Close()
			return "http://" + addr + "/", nil
		}
		if ctx.Err() != nil {
			return "", ctx.Err()
		}
		time.Sleep(50 * time.Millisecond)
	}
	return "", fmt.Errorf("function %s did not listen on %s within 30 s (log: %s)", target, addr, logf.Name())
}

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
	return parsed
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
		default:
			err = fmt.Errorf("unknown key %q (allowed: outcome, at, steps, step, pending)", k)
		}
		if err != nil {
			return sc, fmt.Errorf("scenario %q: %w", text, err)
		}
	}
	return sc, nil
}

// StateDir is the folder of the stack's logs and kubeconfig.
func (s *Stack) StateDir() string { return s.opts.StateDir }

// KeepState keeps the state folder (logs) after Stop, for a failure to be
// looked into.
func (s *Stack) KeepState() { s.keepState = true }

// Stop stops everything the stack started, functions first.
func (s *Stack) Stop() {
	s.stopOnce.Do(func() {
		if s.cancel != nil {
			s.cancel()
			s.wg.Wait()
		}
		for _, c := range s.funcs {
			_ = syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			_ = c.Wait()
		}
		if s.Adapter != nil {
			_ = s.Adapter.Close()
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
