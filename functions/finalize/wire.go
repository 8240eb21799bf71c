// Package finalize is the Finalize function: it discovers a finished run's checkpoints, publishes its completion event and scales the workers to zero.
//
// This build registers the entry point only; the handler is not implemented
// yet and every event is answered with an error.
package finalize

import (
	"context"
	"errors"

	"github.com/cloudevents/sdk-go/v2/event"
)

// Serve is the Finalize entry point.
func Serve(_ context.Context, _ event.Event) error {
	return errors.New("finalize: not implemented in this build")
}
