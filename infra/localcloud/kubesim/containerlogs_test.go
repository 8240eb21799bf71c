package kubesim

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/cri-client/pkg/logs"
	"k8s.io/klog/v2"
)

// TestContainerLogRotation: an instance's log is bounded as the kubelet's
// rotation bounds it, and the kubelet's reader reads the current file.
func TestContainerLogRotation(t *testing.T) {
	c := newContainerLogs(t.TempDir())
	c.maxSize, c.maxFiles = 1000, 3
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "p", UID: "u"}}
	id, err := c.start(pod, "ray-worker", 0)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 200 {
		if err := c.write(id, "stdout", fmt.Sprintf("line %03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	path, _ := c.path(id)
	files, err := filepath.Glob(path + "*")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) != 3 {
		t.Errorf("%d files %v, want the current one and 2 rotated", len(files), files)
	}
	for _, f := range files {
		if st, err := os.Stat(f); err != nil || st.Size() > 1000+64 {
			t.Errorf("%s: %v bytes (%v), want at most about 1000", f, st.Size(), err)
		}
	}
	var out bytes.Buffer
	logger := klog.Background()
	tail := int64(1)
	if err := logs.ReadLogs(context.Background(), &logger, path, id, logs.NewLogOptions(&corev1.PodLogOptions{TailLines: &tail}, time.Now()), c, &out, &out); err != nil {
		t.Fatal(err)
	}
	if got := out.String(); got != "line 199\n" {
		t.Errorf("the last line read %q, want %q", got, "line 199\n")
	}
	c.stop(id)
	if err := c.write(id, "stdout", "after the end"); err == nil || !strings.Contains(err.Error(), "not running") {
		t.Errorf("a write after the container exited: %v", err)
	}
}
