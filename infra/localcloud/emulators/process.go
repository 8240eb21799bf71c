package emulators

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// child is an emulator running as a child process in a process group of its
// own, so that stopping it also ends anything it started.
type child struct {
	name string
	cmd  *exec.Cmd
	out  *lineWriter
	done chan struct{} // closed once the process has been reaped

	stopOnce sync.Once
	stopErr  error
}

// startChild starts argv with env added to this process's environment. Its
// output goes to logDir/<name>.log (discarded when logDir is empty) and every
// line of it is passed to watch, which may be nil.
func startChild(name, logDir string, argv, env []string, watch func(line string)) (*child, error) {
	var logFile io.WriteCloser = nopCloser{io.Discard}
	if logDir != "" {
		if err := os.MkdirAll(logDir, 0o755); err != nil {
			return nil, err
		}
		f, err := os.OpenFile(filepath.Join(logDir, name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			return nil, err
		}
		logFile = f
	}
	out := &lineWriter{dst: logFile, watch: watch}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout = out
	cmd.Stderr = out
	cmd.SysProcAttr = sysProcAttr()
	// The group is killed as a whole; a descendant still holding the output
	// pipe must not keep Wait from returning.
	cmd.WaitDelay = 2 * time.Second
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	c := &child{name: name, cmd: cmd, out: out, done: make(chan struct{})}
	go func() {
		_ = cmd.Wait()
		_ = logFile.Close()
		close(c.done)
	}()
	return c, nil
}

// exited reports whether the process has ended.
func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// stop kills the process group and waits until the process is reaped, so
// that its ports are free when stop returns.
func (c *child) stop() error {
	c.stopOnce.Do(func() {
		if !c.exited() {
			// The negative pid addresses the whole process group.
			if err := syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				c.stopErr = fmt.Errorf("kill %s: %w", c.name, err)
			}
		}
		select {
		case <-c.done:
		case <-time.After(15 * time.Second):
			c.stopErr = fmt.Errorf("%s (pid %d) did not exit after SIGKILL", c.name, c.cmd.Process.Pid)
		}
	})
	return c.stopErr
}

// tail is the end of the process's output, for error messages.
func (c *child) tail() string { return c.out.tail() }

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago. The
// listener is closed before returning, so another process may take the port
// before the emulator binds it; callers retry once on a failed start.
func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return 0, err
	}
	return port, nil
}

// waitReady waits until ready is closed, the process exits, ctx ends or the
// timeout passes.
func waitReady(ctx context.Context, c *child, ready <-chan struct{}, timeout time.Duration) error {
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-ready:
		return nil
	case <-c.done:
		return errExited
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("%s not ready after %v", c.name, timeout)
	}
}

var errExited = errors.New("exited before it was ready")

// lineWriter copies a process's output to dst, hands each complete line to
// watch, and keeps the last few KiB for error messages.
type lineWriter struct {
	mu    sync.Mutex
	dst   io.Writer
	watch func(string)
	part  []byte
	last  []byte
}

const tailBytes = 4096

func (w *lineWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.dst.Write(p)
	w.last = append(w.last, p...)
	if len(w.last) > 2*tailBytes {
		w.last = append([]byte(nil), w.last[len(w.last)-tailBytes:]...)
	}
	if w.watch != nil {
		w.part = append(w.part, p...)
		for {
			i := bytes.IndexByte(w.part, '\n')
			if i < 0 {
				break
			}
			w.watch(strings.TrimRight(string(w.part[:i]), "\r"))
			w.part = w.part[i+1:]
		}
	}
	return len(p), nil
}

func (w *lineWriter) tail() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	b := w.last
	if len(b) > tailBytes {
		b = b[len(b)-tailBytes:]
	}
	return strings.TrimSpace(string(b))
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }
