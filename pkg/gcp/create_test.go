package gcp

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"cloud.google.com/go/storage"
	"github.com/fsouza/fake-gcs-server/fakestorage"
	"google.golang.org/api/option"

	"github.com/raydrop/raydrop/pkg/gcstest"
)

// forbidOverwrite answers an upload to a name already taken with the 403
// an identity without storage.objects.delete may get (instead of the
// precondition's 412), and a request in refused with 403 whatever it is.
func forbidOverwrite(t *testing.T, refused func(*http.Request) bool) *GCS {
	t.Helper()
	srv := gcstest.Server(t, "b")
	srv.CreateObject(fakestorage.Object{ObjectAttrs: fakestorage.ObjectAttrs{BucketName: "b", Name: "taken"}, Content: []byte("first")})
	h := srv.HTTPHandler()
	front := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		name := r.URL.Query().Get("name")
		if refused(r) || r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/upload/") && name == "taken" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"error":{"code":403,"message":"finalize@p.iam.gserviceaccount.com does not have storage.objects.delete access to the Google Cloud Storage object.","errors":[{"reason":"forbidden"}]}}`))
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(front.Close)
	client, err := storage.NewClient(context.Background(), option.WithEndpoint(front.URL+"/storage/v1/"), option.WithoutAuthentication())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = client.Close() })
	return &GCS{Client: client}
}

// TestCreateForbiddenOnATakenName: a create refused with 403 on a name
// already taken is ErrExists, as a 412 is (an earlier delivery's report
// stands and stays in the record); a 403 on a free name is the refusal it
// is.
func TestCreateForbiddenOnATakenName(t *testing.T) {
	ctx := context.Background()
	g := forbidOverwrite(t, func(*http.Request) bool { return false })
	if err := g.Create(ctx, "b", "taken", []byte("again"), "text/html"); !errors.Is(err, ErrExists) {
		t.Errorf("create over an existing object refused with 403: %v, want ErrExists", err)
	}
	if err := g.Create(ctx, "b", "free", []byte("new"), "text/html"); err != nil {
		t.Errorf("create on a free name: %v", err)
	}
	// An identity that may not create at all (nor read): the 403 stands.
	g = forbidOverwrite(t, func(*http.Request) bool { return true })
	err := g.Create(ctx, "b", "other", []byte("x"), "text/html")
	if err == nil || errors.Is(err, ErrExists) || !Unreadable(err) {
		t.Errorf("create with no permission: %v, want the 403", err)
	}
}
