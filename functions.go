// Package raydrop is the root of the raydrop module. It registers the four
// Cloud Run functions with the Functions Framework so that each deploys from
// the repository root with its own entry point (the Go buildpack serves only
// functions registered by the root package):
//
//	Provision  intake (storage object finalized, or a request message) → RayCluster
//	Submit     provisioned → RayJob
//	Monitor    submitted, mark notices and scheduler ticks → progress, deadlines, finished
//	Finalize   finished → checkpoints, completion event, workers to zero
//
// init does no I/O: each function builds its clients on first use.
package raydrop

import (
	"context"
	"fmt"

	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	// The buildpack's generated main imports funcframework; importing it here
	// keeps the deployed dependency graph identical to the tested one.
	_ "github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/cloudevents/sdk-go/v2/event"

	"github.com/raydrop/raydrop/functions/finalize"
	"github.com/raydrop/raydrop/functions/monitor"
	"github.com/raydrop/raydrop/functions/provision"
	"github.com/raydrop/raydrop/functions/submit"
	"github.com/raydrop/raydrop/pkg/ceserve"
	"github.com/raydrop/raydrop/pkg/pipeline"
)

// serve holds each function's entry point by its name in the wiring table
// (pipeline.Functions), which says what the entry point is called.
var serve = map[string]func(context.Context, event.Event) error{
	"provision": provision.Serve,
	"submit":    submit.Serve,
	"monitor":   monitor.Serve,
	"finalize":  finalize.Serve,
}

func init() {
	for _, f := range pipeline.Functions {
		fn, ok := serve[f.Name]
		if !ok {
			panic(fmt.Sprintf("function %s of the wiring table has no handler", f.Name))
		}
		// An HTTP function that decodes each delivery's CloudEvent itself:
		// the Framework's CloudEvent path mixes up concurrent deliveries
		// (pkg/ceserve says how).
		functions.HTTP(f.EntryPoint, ceserve.Handler(fn))
	}
}
