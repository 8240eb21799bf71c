package e2e_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"

	"github.com/raydrop/raydrop/infra/localcloud/stack"
)

// TestStorageIsStrict: the functions' doors and the harness's own client
// reach Cloud Storage through one strict gate (package strictgcs): a
// metadata update through a function's door counts a metageneration the
// harness sees, and both are refused what Cloud Storage refuses.
func TestStorageIsStrict(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	door, err := st.GCSProxy.Door(stack.Functions[0])
	if err != nil {
		t.Fatal(err)
	}
	fn, err := storage.NewClient(ctx, option.WithEndpoint("http://"+door+"/storage/v1/"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = fn.Close() }()
	name := "strict-door/" + time.Now().Format("150405.000000")
	harness := st.GCS.Bucket(stack.StateBucket).Object(name)
	w := harness.If(storage.Conditions{DoesNotExist: true}).NewWriter(ctx)
	_, _ = io.WriteString(w, "{}")
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	gen := w.Attrs().Generation

	at, err := fn.Bucket(stack.StateBucket).Object(name).If(storage.Conditions{MetagenerationMatch: 1}).
		Update(ctx, storage.ObjectAttrsToUpdate{Metadata: map[string]string{"k": "v"}})
	if err != nil || at.Metageneration != 2 {
		t.Fatalf("update through %s's door: %+v %v, want metageneration 2", stack.Functions[0], at, err)
	}
	if at, err := harness.Attrs(ctx); err != nil || at.Metageneration != 2 {
		t.Fatalf("the harness reads %+v %v, want metageneration 2", at, err)
	}
	_, err = fn.Bucket(stack.StateBucket).Object(name).If(storage.Conditions{MetagenerationMatch: 1}).Attrs(ctx)
	if ge := (*googleapi.Error)(nil); !errors.As(err, &ge) || ge.Code != http.StatusPreconditionFailed {
		t.Fatalf("read at a stale metageneration through the door: %v, want 412", err)
	}
	err = harness.If(storage.Conditions{GenerationMatch: gen + 1}).Delete(ctx)
	if ge := (*googleapi.Error)(nil); !errors.As(err, &ge) || ge.Code != http.StatusPreconditionFailed {
		t.Fatalf("the harness's delete at another generation: %v, want 412", err)
	}
	if err := harness.If(storage.Conditions{GenerationMatch: gen, MetagenerationMatch: 2}).Delete(ctx); err != nil {
		t.Fatalf("delete at the current generation and metageneration: %v", err)
	}
}
