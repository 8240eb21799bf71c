package kubesim

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	internalapi "k8s.io/cri-api/pkg/apis"
	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
)

// containerLogs is what the container runtime keeps of each container's
// output: a file per container instance in the CRI log format
// ("2016-10-06T00:17:09.669794202Z stdout F line"), laid out as the kubelet
// lays them out, <dir>/<namespace>_<pod>_<uid>/<container>/<restart>.log
// (https://github.com/kubernetes/design-proposals-archive/blob/main/node/kubelet-cri-logging.md).
// The kubelet's own reader (k8s.io/cri-client/pkg/logs) reads them.
//
// It is also the one method of the runtime's CRI service that reader calls,
// ContainerStatus, which a follow asks to learn whether the container still
// runs; the other methods are not served (they panic).
type containerLogs struct {
	internalapi.RuntimeService

	dir string
	// maxSize and maxFiles bound each instance's log as the kubelet's
	// rotation does (containerLogMaxSize, containerLogMaxFiles: 10 MiB and
	// 5 by default): a file past maxSize is renamed aside and a new one
	// begun; the oldest beyond maxFiles (the current one counted) go.
	// The kubelet's reader reads the current file only.
	maxSize  int64
	maxFiles int
	mu       sync.Mutex
	// byID is each container instance's file, by its containerID as the
	// pod's status gives it (containerd://<64 hex>).
	byID map[string]*containerLog
}

type containerLog struct {
	path    string
	running bool
	rotated []string // the files renamed aside, oldest first
}

func newContainerLogs(dir string) *containerLogs {
	return &containerLogs{dir: dir, byID: map[string]*containerLog{}, maxSize: 10 << 20, maxFiles: 5}
}

// start begins a container instance: its ID and an empty log file.
func (c *containerLogs) start(pod *corev1.Pod, container string, restart int32) (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("kubesim: container ID: %w", err)
	}
	id := "containerd://" + hex.EncodeToString(b)
	dir := filepath.Join(c.dir, fmt.Sprintf("%s_%s_%s", pod.Namespace, pod.Name, pod.UID), container)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("kubesim: container log folder: %w", err)
	}
	path := filepath.Join(dir, fmt.Sprintf("%d.log", restart))
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		return "", fmt.Errorf("kubesim: container log: %w", err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byID[id] = &containerLog{path: path, running: true}
	return id, nil
}

// stop records that the container instance has exited: a follow of its log
// ends once it has read the rest.
func (c *containerLogs) stop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.byID[id]; ok {
		l.running = false
	}
}

// write appends text to the container instance's log as the runtime
// records it: one entry per line, on stream (stdout or stderr), stamped
// now. An instance that has exited writes nothing more.
func (c *containerLogs) write(id, stream, text string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.byID[id]
	if !ok || !l.running {
		return fmt.Errorf("kubesim: container %s is not running", id)
	}
	var b strings.Builder
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		b.WriteString(time.Now().UTC().Format(time.RFC3339Nano))
		b.WriteString(" " + stream + " F " + line + "\n")
	}
	f, err := os.OpenFile(l.path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("kubesim: container log: %w", err)
	}
	if _, err := f.WriteString(b.String()); err != nil {
		_ = f.Close()
		return fmt.Errorf("kubesim: container log: %w", err)
	}
	st, err := f.Stat()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("kubesim: container log: %w", err)
	}
	if st.Size() > c.maxSize {
		return c.rotate(l)
	}
	return nil
}

// rotate renames the instance's log aside, as <path>.<time>, begins an
// empty one, and removes the oldest files beyond maxFiles.
func (c *containerLogs) rotate(l *containerLog) error {
	aside := l.path + "." + time.Now().UTC().Format("20060102-150405.000000000")
	if err := os.Rename(l.path, aside); err != nil {
		return fmt.Errorf("kubesim: rotate container log: %w", err)
	}
	if err := os.WriteFile(l.path, nil, 0o644); err != nil {
		return fmt.Errorf("kubesim: rotate container log: %w", err)
	}
	l.rotated = append(l.rotated, aside)
	for len(l.rotated) > c.maxFiles-1 {
		if err := os.Remove(l.rotated[0]); err != nil {
			return fmt.Errorf("kubesim: rotate container log: %w", err)
		}
		l.rotated = l.rotated[1:]
	}
	return nil
}

// path is the log file of a container instance.
func (c *containerLogs) path(id string) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.byID[id]
	if !ok {
		return "", false
	}
	return l.path, true
}

// ContainerStatus answers the log reader's question while it follows a
// log: does the container still run.
func (c *containerLogs) ContainerStatus(_ context.Context, id string, _ bool) (*runtimeapi.ContainerStatusResponse, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	l, ok := c.byID[id]
	if !ok {
		return nil, status.Errorf(codes.NotFound, "container %q not found", id)
	}
	state := runtimeapi.ContainerState_CONTAINER_EXITED
	if l.running {
		state = runtimeapi.ContainerState_CONTAINER_RUNNING
	}
	return &runtimeapi.ContainerStatusResponse{Status: &runtimeapi.ContainerStatus{Id: id, State: state}}, nil
}
