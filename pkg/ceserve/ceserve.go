// Package ceserve serves a CloudEvent handler over HTTP, one request at a
// time in the request's own goroutine: how every raydrop function (and the
// example subscriber) receives Eventarc's deliveries.
//
// The Functions Framework's CloudEvent registration (functions.CloudEvent)
// passes each request to the handlers through the CloudEvents SDK's HTTP
// protocol, whose one shared channel does not keep a request with its event:
// with concurrent deliveries, a handler can run with another request's
// context, and once a request is cancelled (a push past its deadline) an
// event can wait unhandled until the next request comes
// (cloudevents/sdk-go#1224, #1332). Deployed with a concurrency of 16, a
// function would see exactly that. So the functions register as HTTP
// functions (functions.HTTP, which Eventarc triggers deliver to alike: the
// Functions Framework picks the function by FUNCTION_TARGET, whatever its
// signature) and this decodes the CloudEvent of each request itself, with
// the same SDK.
package ceserve

import (
	"context"
	"fmt"
	"net/http"

	"github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
)

// Handler serves fn: it decodes the request's CloudEvent (binary or
// structured content mode) and calls fn with the request's context. A
// request that carries no valid CloudEvent gets 400; fn's error gets 500,
// which Eventarc retries; success gets 204.
func Handler(fn func(context.Context, event.Event) error) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			http.Error(w, "CloudEvents are delivered with POST", http.StatusMethodNotAllowed)
			return
		}
		e, err := cehttp.NewEventFromHTTPRequest(r)
		if err == nil {
			err = e.Validate()
		}
		if err != nil {
			http.Error(w, fmt.Sprintf("not a CloudEvent: %v", err), http.StatusBadRequest)
			return
		}
		if err := fn(r.Context(), *e); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}
}
