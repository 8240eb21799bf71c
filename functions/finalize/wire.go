package finalize

import (
	"context"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/pkg/pipeline"
)

// Serve is the Finalize entry point: the production handler, built on the first
// event.
func Serve(ctx context.Context, e event.Event) error {
	return pipeline.Serve(ctx, "finalize", pipeline.Default, func(ctx context.Context, d *pipeline.Deps) error {
		return (&Handler{Deps: d}).Handle(ctx, e)
	})
}
