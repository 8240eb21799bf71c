// Package submit is the Submit function: it creates the RayJob of a provisioned run.
//
// This build registers the entry point only; the handler is not implemented
// yet and every event is answered with an error.
package submit

import (
	"context"
	"errors"

	"github.com/cloudevents/sdk-go/v2/event"
)

// Serve is the Submit entry point.
func Serve(_ context.Context, _ event.Event) error {
	return errors.New("submit: not implemented in this build")
}
