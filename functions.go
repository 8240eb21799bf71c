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
	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	// The buildpack's generated main imports funcframework; importing it here
	// keeps the deployed dependency graph identical to the tested one.
	_ "github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	handlers "github.com/raydrop/raydrop/functions"
	"github.com/raydrop/raydrop/pkg/ceserve"
	"github.com/raydrop/raydrop/pkg/wiring"
)

func init() {
	for _, f := range wiring.Functions {
		fn := handlers.Serve(f.Name)
		// An HTTP function that decodes each delivery's CloudEvent itself:
		// the Framework's CloudEvent path mixes up concurrent deliveries
		// (pkg/ceserve says how).
		functions.HTTP(f.EntryPoint, ceserve.Handler(fn))
	}
}
