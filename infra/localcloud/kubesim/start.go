package kubesim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/go-logr/logr"
	configapi "github.com/ray-project/kuberay/ray-operator/apis/config/v1alpha1"
	rayv1 "github.com/ray-project/kuberay/ray-operator/apis/ray/v1"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/batchscheduler"
	"github.com/ray-project/kuberay/ray-operator/controllers/ray/utils"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/types"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/raydrop/raydrop/pkg/kubetest"
)

// KubeRay settings read from the environment. They are set only when unset,
// so a caller can override them.
var kuberayEnv = map[string]string{
	// After the Ray job reached a terminal status, how long the RayJob may
	// stay Running before KubeRay forces it terminal (KubeRay's default: 300).
	utils.RAYJOB_DEPLOYMENT_STATUS_TRANSITION_GRACE_PERIOD_SECONDS: "5",
	// The RayCluster reconciler's periodic resync (default 300).
	utils.RAYCLUSTER_DEFAULT_REQUEUE_SECONDS_ENV: "10",
}

// Scheme holds the kinds the simulator's clients know: client-go's
// built-in kinds, KubeRay's ray.io/v1 and its config API.
func Scheme() *runtime.Scheme {
	s := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(s))
	utilruntime.Must(rayv1.AddToScheme(s))
	utilruntime.Must(configapi.AddToScheme(s))
	return s
}

var setGlobalLoggers sync.Once

// Start starts etcd and kube-apiserver on 127.0.0.1, installs the KubeRay
// CRDs and the admission policy that plays Autopilot's resource maxima
// (kubetest.AutopilotPolicy), and runs KubeRay's RayCluster and RayJob reconcilers with the
// kubelet, Job controller, garbage collector and Ray head stand-ins in one
// controller-runtime manager. It returns once the controllers run; ctx
// bounds the start only, Stop ends the simulator. On any error everything
// started is stopped again.
//
// etcd and kube-apiserver are child processes that outlive this process
// if it exits without Stop (os.Exit, a fatal signal): handle signals and
// call Stop.
func Start(ctx context.Context, o Options) (_ *Sim, err error) {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.Project == "" {
		o.Project = "localcloud"
	}
	if o.Assets == "" {
		o.Assets = os.Getenv("KUBEBUILDER_ASSETS")
	}
	if o.Assets == "" {
		return nil, errors.New("kubesim: no etcd/kube-apiserver folder: set KUBEBUILDER_ASSETS (make tools builds them into RAYDROP_CACHE) or Options.Assets")
	}
	for _, b := range []string{"etcd", "kube-apiserver"} {
		if _, err := os.Stat(filepath.Join(o.Assets, b)); err != nil {
			return nil, fmt.Errorf("kubesim: %s not found in %s: run make tools", b, o.Assets)
		}
	}
	if o.CRDDir == "" {
		if o.CRDDir, err = kubetest.CRDDir(); err != nil {
			return nil, fmt.Errorf("kubesim: %w", err)
		}
	}
	for k, v := range kuberayEnv {
		if _, ok := os.LookupEnv(k); !ok {
			_ = os.Setenv(k, v) // only fails for an invalid name
		}
	}

	ctrlLog := logr.FromSlogHandler(demote{o.Log.With("component", "kuberay").Handler()})
	setGlobalLoggers.Do(func() {
		// Both are process-wide; the first simulator's logger keeps them.
		ctrl.SetLogger(ctrlLog)
		klog.SetLogger(ctrlLog)
	})

	s := &Sim{o: o, log: o.Log}
	defer func() {
		if err != nil {
			if stopErr := s.Stop(); stopErr != nil {
				o.Log.Warn("kubesim: cleanup after failed start", "err", stopErr)
			}
		}
	}()

	// etcd and kube-apiserver.
	scheme := Scheme()
	etcdPort, err := freePort()
	if err != nil {
		return nil, err
	}
	peerPort, err := freePort()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{o.CRDDir},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: o.Assets,
		Scheme:                scheme,
		// envtest waits 10 s for the CRDs to be served by default; an API
		// server started beside others on a busy 2-core machine can take longer.
		CRDInstallOptions: envtest.CRDInstallOptions{MaxTime: 2 * time.Minute},
	}
	etcd := &envtest.Etcd{}
	env.ControlPlane.Etcd = etcd
	etcd.URL = &url.URL{Scheme: "http", Host: fmt.Sprintf("127.0.0.1:%d", etcdPort)}
	etcd.Configure().Set("listen-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	etcd.Configure().Set("initial-advertise-peer-urls", fmt.Sprintf("http://127.0.0.1:%d", peerPort))
	etcd.Configure().Set("initial-cluster", fmt.Sprintf("default=http://127.0.0.1:%d", peerPort))
	api := env.ControlPlane.GetAPIServer()
	api.Address = "127.0.0.1"
	// The kubelets' certificates and the containers' logs live in a folder
	// of the simulator's, removed by Stop.
	if s.dir, err = os.MkdirTemp("", "kubesim-"); err != nil {
		return nil, fmt.Errorf("kubesim: %w", err)
	}
	pki, err := newKubeletPKI(s.dir)
	if err != nil {
		return nil, err
	}
	pki.configure(api)
	t0 := time.Now()
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("kubesim: start kube-apiserver and etcd: %w", err)
	}
	s.env = env
	s.Config = cfg
	user, err := env.ControlPlane.AddUser(envtest.User{Name: "localcloud-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return nil, fmt.Errorf("kubesim: add kubeconfig user: %w", err)
	}
	if s.kubeconfig, err = user.KubeConfig(); err != nil {
		return nil, fmt.Errorf("kubesim: kubeconfig: %w", err)
	}
	o.Log.Info("kube-apiserver up", "server", cfg.Host, "took", time.Since(t0).Round(time.Millisecond))
	// Autopilot's admission refuses a pod that asks for more than its
	// node class allows; the API server refuses it the same way here, so
	// KubeRay meets the refusal as it would on GKE.
	if err := kubetest.InstallAutopilotPolicy(ctx, cfg); err != nil {
		return nil, fmt.Errorf("kubesim: %w", err)
	}

	// The manager, as KubeRay's main.go builds it, minus metrics, probes,
	// webhooks and leader election.
	jobSel, err := labels.NewRequirement(utils.KubernetesCreatedByLabelKey, selection.Equals, []string{utils.ComponentName})
	if err != nil {
		return nil, err
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme: scheme,
		Logger: ctrlLog,
		Cache: cache.Options{
			// KubeRay only caches the batch Jobs it created.
			ByObject: map[client.Object]cache.ByObject{&batchv1.Job{}: {Label: labels.NewSelector().Add(*jobSel)}},
		},
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		LeaderElection:         false,
	})
	if err != nil {
		return nil, fmt.Errorf("kubesim: manager: %w", err)
	}
	s.Client = mgr.GetClient()

	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	s.cancel = cancel

	var config configapi.Configuration
	configapi.SetDefaults_Configuration(&config)
	config.EnableLeaderElection = ptr.To(false)
	bsm, err := batchscheduler.NewSchedulerManager(runCtx, config, cfg, mgr.GetClient())
	if err != nil {
		return nil, fmt.Errorf("kubesim: batch scheduler manager: %w", err)
	}
	bsm.AddToScheme(mgr.GetScheme())

	s.dash = newDashboard(runCtx, s)

	// IsOpenShift is false outright: utils.GetClusterType would read the
	// ambient kubeconfig, not this API server.
	if err := ray.NewReconciler(runCtx, mgr, ray.RayClusterReconcilerOptions{
		IsOpenShift:           false,
		BatchSchedulerManager: bsm,
	}).SetupWithManager(mgr, config.ReconcileConcurrency); err != nil {
		return nil, fmt.Errorf("kubesim: RayCluster controller: %w", err)
	}
	if err := ray.NewRayJobReconciler(runCtx, mgr, ray.RayJobReconcilerOptions{
		BatchSchedulerManager: bsm,
	}, clientProvider{s.dash}).SetupWithManager(mgr, config.ReconcileConcurrency); err != nil {
		return nil, fmt.Errorf("kubesim: RayJob controller: %w", err)
	}
	s.logs = newContainerLogs(filepath.Join(s.dir, "pods"))
	if s.kubeletSrv, err = startKubeletServer(pki, mgr.GetClient(), s.logs, o.Log.With("component", "kubelet")); err != nil {
		return nil, err
	}
	nodes := &nodes{Client: mgr.GetClient(), port: s.kubeletSrv.port, log: o.Log}
	if err := mgr.Add(nodes); err != nil {
		return nil, fmt.Errorf("kubesim: nodes: %w", err)
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("kubelet").For(&corev1.Pod{}).
		Complete(&kubelet{Client: mgr.GetClient(), sim: s, nodes: nodes, logs: s.logs}); err != nil {
		return nil, fmt.Errorf("kubesim: kubelet: %w", err)
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("job-controller").For(&batchv1.Job{}).
		Complete(&jobController{Client: mgr.GetClient(), dash: s.dash, logs: s.logs, subs: map[types.UID]*submitter{}}); err != nil {
		return nil, fmt.Errorf("kubesim: job controller: %w", err)
	}
	if err := mgr.Add(&collector{cache: mgr.GetClient(), api: mgr.GetAPIReader(), writer: mgr.GetClient(), log: o.Log, workloads: o.Kueue}); err != nil {
		return nil, fmt.Errorf("kubesim: garbage collector: %w", err)
	}

	s.mgrDone = make(chan error, 1)
	go func() { s.mgrDone <- mgr.Start(runCtx) }()
	go s.copyRayLogsEvery(runCtx, rayLogsEvery)
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		return nil, errors.New("kubesim: informer caches did not sync")
	}
	select {
	case <-mgr.Elected():
	case <-syncCtx.Done():
		return nil, fmt.Errorf("kubesim: controllers did not start: %w", syncCtx.Err())
	}
	o.Log.Info("kubesim ready", "server", cfg.Host, "took", time.Since(t0).Round(time.Millisecond))
	return s, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("kubesim: free port: %w", err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// demote lowers controller log levels: info and below to Debug, errors
// (mostly transient conflicts and retries) to Warn.
type demote struct{ h slog.Handler }

func demoteLevel(l slog.Level) slog.Level {
	switch {
	case l >= slog.LevelError:
		return slog.LevelWarn
	case l >= slog.LevelInfo:
		return slog.LevelDebug
	default:
		return slog.LevelDebug - 4
	}
}

func (d demote) Enabled(ctx context.Context, l slog.Level) bool {
	return d.h.Enabled(ctx, demoteLevel(l))
}

func (d demote) Handle(ctx context.Context, r slog.Record) error {
	level := demoteLevel(r.Level)
	r2 := slog.NewRecord(r.Time, level, r.Message, r.PC)
	r.Attrs(func(a slog.Attr) bool {
		// Optimistic-concurrency conflicts are routine: the reconciler retries.
		if err, ok := a.Value.Any().(error); ok && apierrors.IsConflict(err) {
			r2.Level = slog.LevelDebug
		}
		r2.AddAttrs(a)
		return true
	})
	if r2.Level != level && !d.h.Enabled(ctx, r2.Level) {
		return nil
	}
	return d.h.Handle(ctx, r2)
}

func (d demote) WithAttrs(as []slog.Attr) slog.Handler { return demote{d.h.WithAttrs(as)} }
func (d demote) WithGroup(n string) slog.Handler       { return demote{d.h.WithGroup(n)} }
