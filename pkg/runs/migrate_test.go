package runs_test

import (
	"context"
	"io"
	"testing"

	"cloud.google.com/go/storage"

	"github.com/raydrop/raydrop/pkg/gcstest"
	"github.com/raydrop/raydrop/pkg/runs"
)

// TestMigrateState copies records and leases, with their metadata, from
// the intake bucket to the state bucket, leaves what the state bucket has
// already, and copies nothing else (specs stay).
func TestMigrateState(t *testing.T) {
	ctx := context.Background()
	c := gcstest.New(t, "intake", "state")
	put := func(bucket, name, body string, meta map[string]string) {
		w := c.Bucket(bucket).Object(name).NewWriter(ctx)
		w.Metadata = meta
		if _, err := io.WriteString(w, body); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	put("intake", "runs/a/status.json", "old a", map[string]string{"raydrop-phase": "RUNNING"})
	put("intake", "runs/b/status.json", "old b", nil)
	put("intake", "clusters/default/c.json", "lease", nil)
	put("intake", "jobs/x.json", "spec", nil)
	put("state", "runs/b/status.json", "newer b", nil)

	copied, present, err := runs.MigrateState(ctx, c.Bucket("intake"), c.Bucket("state"))
	if err != nil || copied != 2 || present != 1 {
		t.Fatalf("copied %d present %d err %v, want 2 1 nil", copied, present, err)
	}
	read := func(name string) (string, *storage.ObjectAttrs) {
		r, err := c.Bucket("state").Object(name).NewReader(ctx)
		if err != nil {
			return "", nil
		}
		defer func() { _ = r.Close() }()
		b, _ := io.ReadAll(r)
		a, _ := c.Bucket("state").Object(name).Attrs(ctx)
		return string(b), a
	}
	if body, a := read("runs/a/status.json"); body != "old a" || a.Metadata["raydrop-phase"] != "RUNNING" {
		t.Errorf("runs/a: %q %v", body, a)
	}
	if body, _ := read("runs/b/status.json"); body != "newer b" {
		t.Errorf("runs/b was overwritten: %q", body)
	}
	if body, _ := read("clusters/default/c.json"); body != "lease" {
		t.Errorf("lease: %q", body)
	}
	if body, _ := read("jobs/x.json"); body != "" {
		t.Errorf("a spec was copied: %q", body)
	}
}
