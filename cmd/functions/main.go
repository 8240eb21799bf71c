// Command functions serves raydrop's Cloud Run functions the way the Go
// buildpack's generated main does: it imports the root package, which
// registers Provision, Submit, Monitor and Finalize, and starts the
// Functions Framework on $PORT; FUNCTION_TARGET picks the function. The
// local cloud runs one process of it per function.
package main

import (
	"log"
	"os"

	"github.com/GoogleCloudPlatform/functions-framework-go/funcframework"

	_ "github.com/raydrop/raydrop"
)

func main() {
	port := os.Getenv("PORT")
	if port == "" {
		port = "8080"
	}
	hostname := os.Getenv("LOCAL_ONLY")
	if hostname == "true" {
		hostname = "127.0.0.1"
	} else {
		hostname = ""
	}
	if err := funcframework.StartHostPort(hostname, port); err != nil {
		log.Fatalf("functions: %v", err)
	}
}
