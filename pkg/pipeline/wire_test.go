package pipeline

import (
	"context"
	"os"
	"path/filepath"
	"testing"

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
