package gcsdoc

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"cloud.google.com/go/storage"

	"github.com/raydrop/raydrop/pkg/gcstest"
)

func bucket(t *testing.T) *storage.BucketHandle {
	t.Helper()
	return gcstest.New(t, "b").Bucket("b")
}

type counter struct{ N int }

// TestUpdateUnderContention: concurrent updates of one document each count
// once; none is lost to a race.
func TestUpdateUnderContention(t *testing.T) {
	obj := bucket(t).Object("doc.json")
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			if _, err := Update(ctx, obj, func(c *counter, _ bool) error { c.N++; return nil }, nil); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	var c counter
	if _, err := Read(ctx, obj, &c); err != nil || c.N != 8 {
		t.Errorf("counter %d (%v), want 8", c.N, err)
	}
}

func TestUpdate(t *testing.T) {
	b := bucket(t)
	ctx := context.Background()
	obj := b.Object("doc.json")
	var c counter
	if _, err := Read(ctx, obj, &c); !errors.Is(err, ErrNotFound) {
		t.Fatalf("missing document: %v, want ErrNotFound", err)
	}
	got, err := Update(ctx, obj, func(c *counter, exists bool) error {
		if exists {
			t.Error("a missing document exists")
		}
		c.N = 5
		return nil
	}, func(c *counter) map[string]string { return map[string]string{"n": "five"} })
	if err != nil || got.N != 5 {
		t.Fatalf("%+v %v", got, err)
	}
	if a, err := obj.Attrs(ctx); err != nil || a.Metadata["n"] != "five" {
		t.Errorf("metadata %v (%v)", a, err)
	}
	gen := attrsGen(t, obj)
	got, err = Update(ctx, obj, func(c *counter, _ bool) error { c.N = 99; return ErrNoChange }, nil)
	if err != nil || attrsGen(t, obj) != gen {
		t.Errorf("ErrNoChange wrote the document: %+v %v", got, err)
	}
	boom := errors.New("boom")
	if _, err := Update(ctx, obj, func(*counter, bool) error { return boom }, nil); !errors.Is(err, boom) || attrsGen(t, obj) != gen {
		t.Errorf("a failing update: %v, generation changed %v", err, attrsGen(t, obj) != gen)
	}
	if err := Write(ctx, obj, &counter{1}, storage.Conditions{DoesNotExist: true}, nil); !IsPrecondition(err) {
		t.Errorf("create over an existing document: %v, want a precondition failure", err)
	}
}

func attrsGen(t *testing.T, obj *storage.ObjectHandle) int64 {
	t.Helper()
	a, err := obj.Attrs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return a.Generation
}

// TestUpdatesArePaced: updates of one document one after another are
// written at least WriteInterval apart, as Cloud Storage's limit of one
// write per second to an object requires, and none is lost.
func TestUpdatesArePaced(t *testing.T) {
	obj := bucket(t).Object("paced.json")
	ctx := context.Background()
	var times []time.Time
	for range 3 {
		if _, err := Update(ctx, obj, func(c *counter, _ bool) error { c.N++; return nil }, nil); err != nil {
			t.Fatal(err)
		}
		a, err := obj.Attrs(ctx)
		if err != nil {
			t.Fatal(err)
		}
		times = append(times, a.Updated)
	}
	for i := 1; i < len(times); i++ {
		if gap := times[i].Sub(times[i-1]); gap < WriteInterval {
			t.Errorf("write %d came %v after the one before, want at least %v", i+1, gap, WriteInterval)
		}
	}
	var c counter
	if _, err := Read(ctx, obj, &c); err != nil || c.N != 3 {
		t.Errorf("counter %d (%v), want 3", c.N, err)
	}
}
