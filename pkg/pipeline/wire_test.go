package pipeline

import (
	"context"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	rayfake "github.com/ray-project/kuberay/ray-operator/pkg/client/clientset/versioned/fake"
	"google.golang.org/api/option"
	kubefake "k8s.io/client-go/kubernetes/fake"

	"github.com/raydrop/raydrop/pkg/config"
)

// TestKubeClientRateLimit: the functions' Kubernetes clients are not held
// to client-go's default 5 requests/s, which queued concurrent handlers
// behind each other.
func TestKubeClientRateLimit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kc := "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n" +
		"contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {}}]\n"
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	rc, err := kubeConfig(context.Background(), config.Config{Kubeconfig: path})
	if err != nil {
		t.Fatal(err)
	}
	if rc.QPS != kubeQPS || rc.Burst != kubeBurst || rc.QPS < 50 {
		t.Errorf("QPS %v burst %d, want %d and %d", rc.QPS, rc.Burst, kubeQPS, kubeBurst)
	}
}

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, string, []byte, map[string]string) error { return nil }

type nopBus struct{}

func (nopBus) Publish(context.Context, string, string) error { return nil }

// TestAssembleSetsEveryDependency: Assemble, the one place the deployed
// functions, the benchmark and the handler tables get their dependencies,
// sets every field of Deps, so a dependency added to Deps and not to
// Assemble fails here instead of as a nil pointer in one caller only.
func TestAssembleSetsEveryDependency(t *testing.T) {
	gcs, err := storage.NewClient(context.Background(), option.WithoutAuthentication(), option.WithEndpoint("http://127.0.0.1:1/storage/v1/"))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = gcs.Close() }()
	d := Assemble(config.Config{Project: "p", StateBucket: "state"}, Clients{
		GCS: gcs, Publisher: nopPublisher{}, Bus: nopBus{}, Ray: rayfake.NewSimpleClientset(),
		Kube: kubefake.NewClientset().CoreV1(), Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Clock: func() time.Time { return time.Unix(0, 0) },
	})
	v := reflect.ValueOf(*d)
	for i := range v.NumField() {
		if v.Field(i).IsZero() {
			t.Errorf("Assemble leaves Deps.%s unset", v.Type().Field(i).Name)
		}
	}
}
