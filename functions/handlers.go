// Package functions is the registry of the pipeline's handlers: one for
// each function of the wiring table (pkg/wiring), by its name. The root
// package registers the entry points from it, and the flow tests deliver
// through it.
package functions

import (
	"context"

	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/functions/finalize"
	"github.com/raydrop/raydrop/functions/monitor"
	"github.com/raydrop/raydrop/functions/provision"
	"github.com/raydrop/raydrop/functions/submit"
	"github.com/raydrop/raydrop/pkg/pipeline"
)

// Handler handles one delivery of a function.
type Handler interface {
	Handle(context.Context, event.Event) error
}

// Handlers build each function's handler over its dependencies.
var Handlers = map[string]func(*pipeline.Deps) Handler{
	"provision": func(d *pipeline.Deps) Handler { return &provision.Handler{Deps: d} },
	"submit":    func(d *pipeline.Deps) Handler { return &submit.Handler{Deps: d} },
	"monitor":   func(d *pipeline.Deps) Handler { return &monitor.Handler{Deps: d} },
	"finalize":  func(d *pipeline.Deps) Handler { return &finalize.Handler{Deps: d} },
}

// Serve is the named function's entry point: its handler over the
// production dependencies, built on the first event (pipeline.Serve).
// It panics for a name with no handler, at registration, never on an event.
func Serve(name string) func(context.Context, event.Event) error {
	build, ok := Handlers[name]
	if !ok {
		panic("function " + name + " of the wiring table has no handler")
	}
	return func(ctx context.Context, e event.Event) error {
		return pipeline.Serve(ctx, name, pipeline.Default, func(ctx context.Context, d *pipeline.Deps) error {
			return build(d).Handle(ctx, e)
		})
	}
}
