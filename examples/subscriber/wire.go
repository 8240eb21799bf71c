package subscriber

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"sync"

	"cloud.google.com/go/storage"
	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/ceserve"
	"github.com/raydrop/raydrop/pkg/logging"
)

func init() {
	// An HTTP function that decodes each delivery's CloudEvent itself: the
	// Framework's CloudEvent path mixes up concurrent deliveries
	// (cloudevents/sdk-go#1224, #1332; pkg/ceserve).
	functions.HTTP(EntryPoint, ceserve.Handler(Serve))
}

// DefaultPrefix is the folder under which promotions go when
// SUBSCRIBER_PREFIX is not set.
const DefaultPrefix = "models"

// Config is the subscriber's configuration, read once from SUBSCRIBER_*
// environment variables.
type Config struct {
	// Bucket (SUBSCRIBER_BUCKET, required) receives the promoted files.
	Bucket string
	// Prefix (SUBSCRIBER_PREFIX, default "models") is the folder of the
	// promotions: <prefix>/<name>/latest/. "/" puts them at the bucket's top.
	Prefix string
}

// LoadConfig reads the configuration from getenv (os.Getenv when nil) and
// reports every missing or malformed variable at once.
func LoadConfig(getenv func(string) string) (Config, error) {
	if getenv == nil {
		getenv = os.Getenv
	}
	var errs []error
	c := Config{Bucket: strings.TrimSpace(getenv("SUBSCRIBER_BUCKET")), Prefix: DefaultPrefix}
	switch {
	case c.Bucket == "":
		errs = append(errs, errors.New("SUBSCRIBER_BUCKET is not set: name the bucket that receives the promoted adapters"))
	case strings.HasPrefix(c.Bucket, "gs://") || strings.Contains(c.Bucket, "/"):
		errs = append(errs, fmt.Errorf("SUBSCRIBER_BUCKET %q is not a bucket name (write it without gs:// and without a folder; the folder is SUBSCRIBER_PREFIX)", c.Bucket))
	}
	if p := strings.TrimSpace(getenv("SUBSCRIBER_PREFIX")); p != "" {
		c.Prefix = strings.Trim(p, "/")
		if c.Prefix != "" && slices.ContainsFunc(strings.Split(c.Prefix, "/"), func(s string) bool { return s == "" || s == "." || s == ".." }) {
			errs = append(errs, fmt.Errorf("SUBSCRIBER_PREFIX %q is not a folder (it has an empty, . or .. segment)", p))
		}
	}
	return c, errors.Join(errs...)
}

// production is the deployed handler, built on the first event (init does
// no I/O) and kept for the instance's life. The storage client honours
// STORAGE_EMULATOR_HOST, so the same binary runs against an emulator.
var production = sync.OnceValues(func() (*Handler, error) {
	cfg, err := LoadConfig(nil)
	if err != nil {
		return nil, fmt.Errorf("configuration: %w", err)
	}
	c, err := storage.NewClient(context.Background())
	if err != nil {
		return nil, fmt.Errorf("storage client: %w", err)
	}
	return &Handler{Storage: c, Bucket: cfg.Bucket, Prefix: cfg.Prefix, Log: logging.New(os.Stdout, slog.LevelInfo)}, nil
})

// Serve is the PromoteAdapter entry point. A configuration error is
// returned, not acknowledged: the events wait in the subscription, retried
// with backoff, until a deployment with the right configuration takes them.
func Serve(ctx context.Context, e event.Event) error {
	h, err := production()
	if err != nil {
		logging.New(os.Stdout, slog.LevelInfo).Error("subscriber_unconfigured", "event_id", e.ID(), "error", err.Error())
		return err
	}
	return h.Handle(ctx, e)
}
