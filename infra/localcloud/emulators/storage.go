package emulators

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/option"
)

// FakeGCSVersion is the fake-gcs-server release the local cloud runs, built
// from infra/tools/fakegcs with the local cloud's indexed in-memory store
// (infra/tools/fakegcs/backend/memory.go).
const FakeGCSVersion = "v1.56.1"

// FakeGCSEnv names the environment variable that, when set, gives the path
// of the fake-gcs-server binary. The Makefile sets it to the binary it
// builds.
const FakeGCSEnv = "RAYDROP_FAKE_GCS"

// FakeGCSBinary returns the fake-gcs-server binary: $RAYDROP_FAKE_GCS, else
// the newest $RAYDROP_CACHE/bin/fake-gcs-server-<FakeGCSVersion>-store-*
// (RAYDROP_CACHE defaulting to ~/.cache/raydrop), where the Makefile's tools
// build it, keyed by the store's hash.
func FakeGCSBinary() (string, error) {
	path, pattern, err := FromCache(FakeGCSEnv, filepath.Join("bin", "fake-gcs-server-"+FakeGCSVersion+"-store-*"))
	if err != nil || path != "" {
		return path, err
	}
	return "", fmt.Errorf("fake-gcs-server %s not found at %s: run `make tools` in the repository root "+
		"(it builds infra/tools/fakegcs), or set %s to a fake-gcs-server binary", FakeGCSVersion, pattern, FakeGCSEnv)
}

// FromCache is what make built into RAYDROP_CACHE (default
// ~/.cache/raydrop): $env when it is set (an error when it names nothing),
// else the newest path matching glob under the cache that is not a ".tmp"
// build in progress, "" when none does. pattern is the glob in full.
func FromCache(env, glob string) (path, pattern string, err error) {
	if p := os.Getenv(env); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", p, fmt.Errorf("%s: %w", env, err)
		}
		return p, p, nil
	}
	cache := os.Getenv("RAYDROP_CACHE")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", "", err
		}
		cache = filepath.Join(home, ".cache", "raydrop")
	}
	pattern = filepath.Join(cache, glob)
	matches, _ := filepath.Glob(pattern)
	var newestTime time.Time
	for _, m := range matches {
		if fi, err := os.Stat(m); err == nil && !strings.HasSuffix(m, ".tmp") && fi.ModTime().After(newestTime) {
			path, newestTime = m, fi.ModTime()
		}
	}
	return path, pattern, nil
}

// Storage is a running fake-gcs-server, the Cloud Storage emulator.
type Storage struct {
	// Host is the emulator's address, 127.0.0.1:port, the value of
	// STORAGE_EMULATOR_HOST for the clients that use it.
	Host string

	proc *child
}

// StartStorage starts fake-gcs-server (binary, see FakeGCSBinary) on a free
// port of 127.0.0.1 with an in-memory backend and returns once it serves.
// Its output goes to logDir/fake-gcs-server.log (discarded when logDir is
// empty).
//
// When notifyTopic is not empty, the topic is created on pubsub and every
// object event of every bucket (OBJECT_FINALIZE, OBJECT_DELETE,
// OBJECT_METADATA_UPDATE) is published to it in the Cloud Storage
// notification format (payload JSON_API_V1), as a bucket notification
// configuration without an event-type filter does; an Eventarc trigger's
// filters then pick what they match. Buckets' own notification
// configurations (the notificationConfigs API) work as well.
func StartStorage(ctx context.Context, binary string, pubsub *PubSub, notifyTopic string, logDir string) (*Storage, error) {
	if _, err := os.Stat(binary); err != nil {
		return nil, fmt.Errorf("fake-gcs-server: %w", err)
	}
	var env []string
	if pubsub != nil {
		env = pubsub.Env()
	}
	if notifyTopic != "" {
		if pubsub == nil {
			return nil, errors.New("fake-gcs-server: a notification topic needs the pubsub emulator")
		}
		if err := pubsub.CreateTopics(ctx, notifyTopic); err != nil {
			return nil, err
		}
	}
	var lastErr error
	for attempt := 0; attempt < 2; attempt++ { // the second attempt covers a lost race for the port
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		argv := []string{binary,
			"-scheme", "http", "-host", "127.0.0.1", "-port", strconv.Itoa(port),
			"-backend", "memory",
			// The Go client reads objects through the XML API at its endpoint's
			// host; fake-gcs-server serves those reads for the public host only.
			"-public-host", "127.0.0.1",
		}
		if notifyTopic != "" {
			argv = append(argv,
				"-event.pubsub-project-id", pubsub.Project,
				"-event.pubsub-topic", notifyTopic,
				"-event.list", "finalize,delete,metadataUpdate")
		}
		proc, err := startChild("fake-gcs-server", logDir, argv, env, nil)
		if err != nil {
			return nil, err
		}
		host := "127.0.0.1:" + strconv.Itoa(port)
		err = waitHealthy(ctx, proc, "http://"+host+"/_internal/healthcheck", 30*time.Second)
		if err == nil {
			return &Storage{Host: host, proc: proc}, nil
		}
		_ = proc.stop()
		lastErr = fmt.Errorf("fake-gcs-server on port %d: %w\n%s", port, err, proc.tail())
		if !errors.Is(err, errExited) {
			break
		}
	}
	return nil, lastErr
}

// Stop kills the emulator and waits for it to exit; its port is free when
// Stop returns. Stop may be called more than once.
func (s *Storage) Stop() error { return s.proc.stop() }

// Env is the environment a client of this emulator needs.
func (s *Storage) Env() []string {
	return []string{"STORAGE_EMULATOR_HOST=" + s.Host}
}

// URL is the emulator's base URL, http://127.0.0.1:port.
func (s *Storage) URL() string { return "http://" + s.Host }

// NewClient returns a Cloud Storage client of the emulator; the caller
// closes it.
func (s *Storage) NewClient(ctx context.Context) (*storage.Client, error) {
	return storage.NewClient(ctx,
		option.WithEndpoint(s.URL()+"/storage/v1/"),
		option.WithoutAuthentication(),
	)
}

// waitHealthy polls url until it answers 200, the process exits, ctx ends
// or the timeout passes.
func waitHealthy(ctx context.Context, c *child, url string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	hc := &http.Client{Timeout: time.Second}
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := hc.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-c.done:
			return errExited
		case <-ctx.Done():
			return fmt.Errorf("%s not healthy: %w", c.name, ctx.Err())
		case <-tick.C:
		}
	}
}
