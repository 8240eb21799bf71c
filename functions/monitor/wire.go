// Package monitor is the Monitor function: it follows RayJobs, records progress, enforces deadlines and announces finished runs.
//
// This build registers the entry point only; the handler is not implemented
// yet and every event is answered with an error.
package monitor

import (
	"context"
	"errors"

	"github.com/cloudevents/sdk-go/v2/event"
)

// Serve is the Monitor entry point.
func Serve(_ context.Context, _ event.Event) error {
	return errors.New("monitor: not implemented in this build")
}
