package stack

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/raydrop/raydrop/examples/subscriber"
	"github.com/raydrop/raydrop/infra/localcloud/eventarc"
	"github.com/raydrop/raydrop/pkg/wiring"
)

// ModelsBucket is where the example subscriber (examples/subscriber)
// promotes the best adapter of each succeeded run.
const ModelsBucket = "raydrop-local-models"

// SubscriberRoute is the example subscriber's trigger on the events topic.
const SubscriberRoute = "subscriber"

// subscriberIdentity is the example subscriber's service account, as
// examples/subscriber/main.tf names it (var.name's default).
var subscriberIdentity = "raydrop-subscriber@" + Project + ".iam.gserviceaccount.com"

// startSubscriber builds examples/subscriber and runs it as its deployment
// would: its own process and identity, and a Pub/Sub trigger on the events
// topic like any downstream team's. Its identity holds what
// examples/subscriber/main.tf grants: roles/storage.objectViewer on the
// checkpoint buckets and roles/storage.objectAdmin on the models bucket;
// Cloud Storage refuses it everything else, copies out of any other bucket
// included (a rewrite needs storage.objects.get on the source and
// storage.objects.create, and delete to replace, on the destination:
// https://cloud.google.com/storage/docs/json_api/v1/objects/rewrite#iam-permissions).
func (s *Stack) startSubscriber(ctx context.Context) (eventarc.Route, error) {
	bin := filepath.Join(s.opts.StateDir, "subscriber")
	args := []string{"build", "-o", bin}
	if s.opts.Race {
		args = append(args, "-race")
	}
	build := exec.CommandContext(ctx, "go", append(args, "./examples/subscriber/cmd/subscriber")...)
	build.Dir = s.opts.Repo
	build.Env = append(os.Environ(), BuildEnv...)
	if out, err := build.CombinedOutput(); err != nil {
		return eventarc.Route{}, fmt.Errorf("build the example subscriber: %w\n%s", err, out)
	}
	if err := s.GCS.Bucket(ModelsBucket).Create(ctx, Project, nil); err != nil && !strings.Contains(err.Error(), "409") {
		return eventarc.Route{}, fmt.Errorf("create bucket %s: %w", ModelsBucket, err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return eventarc.Route{}, err
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	target := subscriber.EntryPoint
	door, err := s.GCSProxy.Door(target)
	if err != nil {
		return eventarc.Route{}, err
	}
	s.GCSProxy.Refuse(target, func(method, path string) (int, string) {
		bucket, perm := bucketOf(path), permission(method, path)
		read := method == http.MethodGet || method == http.MethodHead
		switch {
		case strings.HasPrefix(perm, "storage.buckets."): // no role it holds has one
		case bucket == ModelsBucket && !strings.Contains(path, "/copyTo/") && !strings.Contains(path, "/rewriteTo/"):
			return 0, ""
		case slices.Contains(s.opts.OutputBuckets, bucket) && (read || rewriteInto(path, ModelsBucket)):
			return 0, ""
		}
		return http.StatusForbidden, forbiddenFor(subscriberIdentity, perm)
	})
	f := &function{name: target, bin: bin, port: port, logPath: filepath.Join(s.opts.StateDir, "subscriber.log")}
	f.env = append(os.Environ(), "GORACE=halt_on_error=1", "FUNCTION_TARGET="+target, "PORT="+strconv.Itoa(port), "LOCAL_ONLY=true",
		"SUBSCRIBER_BUCKET="+ModelsBucket, "STORAGE_EMULATOR_HOST="+door)
	if err := f.start(ctx); err != nil {
		return eventarc.Route{}, err
	}
	s.funcs[target] = f
	return eventarc.Route{Name: SubscriberRoute, Kind: eventarc.PubSubPublished, Target: f.url(), Topic: s.PubSub.TopicName(Topics.Name(wiring.TopicEvents))}, nil
}

// rewriteInto reports whether path is a rewrite (server-side copy) into
// bucket: POST /storage/v1/b/SRC/o/NAME/rewriteTo/b/DST/o/NAME.
func rewriteInto(path, bucket string) bool {
	path, _, _ = strings.Cut(path, "?")
	_, dst, ok := strings.Cut(path, "/rewriteTo/b/")
	return ok && strings.HasPrefix(dst, bucket+"/")
}

// SubscriberLog is the example subscriber's log ("" when it is not running).
func (s *Stack) SubscriberLog() string {
	if f, ok := s.funcs[subscriber.EntryPoint]; ok {
		return f.logPath
	}
	return ""
}
