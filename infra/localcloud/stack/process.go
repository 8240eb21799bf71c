package stack

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/raydrop/raydrop/pkg/config"
)

// The functions' processes: started as the Cloud Run functions Go runtime
// would, killed and restarted as crashed instances are replaced.

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
	// downs are the spans from each kill to the restarted process's first
	// accepted connection (an open end: not up again yet).
	downs []span
}

// span is a stretch of time; a zero To is still open.
type span struct{ From, To time.Time }

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
		EventBus: BusName, TrainerImage: TrainerImage, HubEndpoint: s.Hub.URL(),
	}
	if len(s.opts.OutputBuckets) > 0 {
		cfg.ModelStaging = "gs://" + s.opts.OutputBuckets[0] + "/" + ModelStagingPrefix
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
			f.mu.Lock()
			if n := len(f.downs); n > 0 && f.downs[n-1].To.IsZero() {
				f.downs[n-1].To = time.Now()
			}
			f.mu.Unlock()
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
	if !f.killed {
		f.downs = append(f.downs, span{From: time.Now()})
	}
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

// DownDuring says whether fn's process was killed, and not yet serving
// again, at some moment between from and to: a push in that stretch may
// have had no answer because of the kill.
func (s *Stack) DownDuring(fn string, from, to time.Time) bool {
	f, ok := s.funcs[fn]
	if !ok {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, d := range f.downs {
		if !d.From.After(to) && (d.To.IsZero() || !d.To.Before(from)) {
			return true
		}
	}
	return false
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
