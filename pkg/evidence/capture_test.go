package evidence

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// logsFrom serves the pods' logs from another server than the fake
// clientset's, which answers every log request "fake logs".
type logsFrom struct {
	corev1client.CoreV1Interface
	rc rest.Interface
}

func (l logsFrom) Pods(ns string) corev1client.PodInterface {
	return podLogsFrom{l.CoreV1Interface.Pods(ns), l.rc, ns}
}

type podLogsFrom struct {
	corev1client.PodInterface
	rc rest.Interface
	ns string
}

func (p podLogsFrom) GetLogs(name string, opts *corev1.PodLogOptions) *rest.Request {
	return p.rc.Get().Namespace(p.ns).Resource("pods").Name(name).SubResource("log").VersionedParams(opts, scheme.ParameterCodec)
}

// memory keeps what a capture writes.
type memory struct {
	mu    sync.Mutex
	files map[string][]byte
}

func (m *memory) Create(_ context.Context, name string, data []byte, _ string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.files[name]; ok {
		return ErrExists
	}
	m.files[name] = data
	return nil
}

// TestCaptureOfLogsThatMisbehave: a pod gone before its log is read, a
// log that never ends and a binary log do not break the capture: the gone
// one and the cut one are named missing, the budget holds, the binary one
// is kept capped, and the manifest is written.
func TestCaptureOfLogsThatMisbehave(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case strings.Contains(r.URL.Path, "/pods/c-head-gone0/"):
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			_ = json.NewEncoder(w).Encode(metav1.Status{TypeMeta: metav1.TypeMeta{Kind: "Status", APIVersion: "v1"}, Status: metav1.StatusFailure, Reason: metav1.StatusReasonNotFound, Code: http.StatusNotFound, Message: `pods "c-head-gone0" not found`})
		case strings.Contains(r.URL.Path, "/pods/c-g-worker-endls/"):
			for r.Context().Err() == nil { // never ends
				_, _ = w.Write([]byte("still going\n"))
				w.(http.Flusher).Flush()
				time.Sleep(time.Millisecond)
			}
		case strings.Contains(r.URL.Path, "/pods/c-g-worker-binry/"):
			b := make([]byte, 64<<10)
			for i := range b {
				b[i] = byte(i * 7)
			}
			_, _ = w.Write(b)
		}
	}))
	defer srv.Close()
	rc, err := rest.RESTClientFor(&rest.Config{Host: srv.URL, APIPath: "/api", ContentConfig: rest.ContentConfig{GroupVersion: &corev1.SchemeGroupVersion, NegotiatedSerializer: scheme.Codecs.WithoutConversion()}})
	if err != nil {
		t.Fatal(err)
	}
	var objs []corev1.Pod
	for _, name := range []string{"c-head-gone0", "c-g-worker-endls", "c-g-worker-binry"} {
		objs = append(objs, corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "ns", Labels: map[string]string{"ray.io/cluster": "c"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "ray"}}},
			Status:     corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{{Name: "ray", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}},
		})
	}
	cs := fake.NewClientset(&objs[0], &objs[1], &objs[2])
	w := &memory{files: map[string][]byte{}}
	start := time.Now()
	m, err := Capture(context.Background(), logsFrom{cs.CoreV1(), rc}, w, Target{RunID: "r", Attempt: 1, Namespace: "ns", Cluster: "c", RayJob: "r-1"},
		Options{Budget: 2 * time.Second, LogCap: 4096}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the capture took %s with a budget of 2s", took)
	}
	why := map[string]string{}
	for _, x := range m.Missing {
		why[x.What] = x.Why
	}
	if w := why["logs/c-head-gone0/ray.log.gz"]; !strings.HasPrefix(w, "read: gone:") {
		t.Errorf("the gone pod's log: missing %q, want read: gone: ...", w)
	}
	if w := why["logs/c-g-worker-endls/ray.log.gz (the end of the log)"]; !strings.Contains(w, "budget was spent") {
		t.Errorf("the endless log: missing %q, want the budget named (missing: %+v)", w, m.Missing)
	}
	files := map[string]File{}
	for _, f := range m.Files {
		files[f.Path] = f
	}
	if f := files["logs/c-g-worker-binry/ray.log.gz"]; !f.Capped || f.LogBytes != 64<<10 {
		t.Errorf("the binary log: %+v, want kept capped, 65536 bytes read", f)
	}
	if m.Complete {
		t.Error("a capture with missing logs says it is complete")
	}
	if _, ok := w.files[ManifestFile]; !ok {
		t.Error("no manifest written")
	}
}
