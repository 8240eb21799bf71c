// Package provision is the Provision function: it takes a job spec from the intake bucket or the requests topic, records the run and brings its RayCluster up.
//
// This build registers the entry point only; the handler is not implemented
// yet and every event is answered with an error.
package provision

import (
	"context"
	"errors"

	"github.com/cloudevents/sdk-go/v2/event"
)

// Serve is the Provision entry point.
func Serve(_ context.Context, _ event.Event) error {
	return errors.New("provision: not implemented in this build")
}
