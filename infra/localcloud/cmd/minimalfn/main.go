// Command minimalfn is the smallest Cloud Run function the Functions
// Framework for Go serves: one CloudEvent function that does nothing, with
// the main the Go buildpack generates. The benchmark builds it the way it
// builds raydrop's functions and compares their start-up and memory.
package main

import (
	"context"
	"log"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"
	"github.com/GoogleCloudPlatform/functions-framework-go/functions"
	"github.com/cloudevents/sdk-go/v2/event"
)

func init() {
	functions.CloudEvent("Minimal", func(context.Context, event.Event) error { return nil })
}

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	if err := funcframework.StartHostPort("127.0.0.1", port); err != nil {
		log.Fatalf("minimalfn: %v", err)
	}
}
