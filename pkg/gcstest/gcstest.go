// Package gcstest serves Cloud Storage in-process for tests:
// fake-gcs-server without a listener, behind the real storage client.
package gcstest

import (
	"testing"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
)

// New starts a server holding buckets, stopped when t ends, and returns
// its client.
func New(t testing.TB, buckets ...string) *storage.Client {
	t.Helper()
	return Server(t, buckets...).Client()
}

// Server starts a server holding buckets, stopped when t ends.
func Server(t testing.TB, buckets ...string) *fakestorage.Server {
	t.Helper()
	srv, err := fakestorage.NewServerWithOptions(fakestorage.Options{NoListener: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	for _, b := range buckets {
		srv.CreateBucketWithOpts(fakestorage.CreateBucketOpts{Name: b})
	}
	return srv
}
