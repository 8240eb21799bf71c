// Command raydrop validates, renders, submits and follows raydrop fine-tuning
// jobs. Run "raydrop help" for the commands.
package main

import (
	"context"
	"os"
	"os/signal"

	"github.com/raydrop/raydrop/pkg/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	code := cli.Run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
