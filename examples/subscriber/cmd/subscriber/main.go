// Command subscriber serves the example subscriber the way the Go
// buildpack's generated main does: it imports the package, which registers
// PromoteAdapter, and starts the Functions Framework on $PORT (8080 by
// default; LOCAL_ONLY=true listens on 127.0.0.1 only). Run it with
// FUNCTION_TARGET=PromoteAdapter, SUBSCRIBER_BUCKET and, against an
// emulator, STORAGE_EMULATOR_HOST.
package main

import (
	"log"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	_ "github.com/raydrop/raydrop/examples/subscriber"
)

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	hostname := ""
	if os.Getenv("LOCAL_ONLY") == "true" {
		hostname = "127.0.0.1"
	}
	if err := funcframework.StartHostPort(hostname, port); err != nil {
		log.Fatalf("subscriber: %v", err)
	}
}
