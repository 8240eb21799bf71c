// Package cli implements the raydrop command: each subcommand is a function
// from arguments and streams to an exit code, so tests run it in process.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sort"
	"strings"
)

// Exit codes.
const (
	ExitOK      = 0
	ExitFailure = 1 // the command ran and the answer is "no" (invalid spec, failed run) or it could not finish
	ExitUsage   = 2
)

type command struct {
	name    string
	args    string
	summary string
	run     func(ctx context.Context, e *env, args []string) int
}

type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	// flags, when set, asks the command only for its flag set: parse
	// stores it here and the command returns (shell completion).
	flags **flag.FlagSet
}

func commands() []command {
	return []command{
		{"validate", "FILE", "check a job spec; print one 'path: problem' line per problem", runValidate},
		{"render", "FILE [--run-id ID] [--attempt N]", "print the run's Kubernetes objects as YAML for kubectl apply -f -", runRender},
		{"submit", "FILE [--via bucket|topic]", "upload the spec to the intake bucket or publish it to the requests topic; print the run ID", runSubmit},
		{"list", "[--json]", "list the runs, newest first", runList},
		{"status", "[RUN] [--json]", "show a run (or list them all)", runStatus},
		{"watch", "RUN", "follow a run to its end with its training progress; exit 0 only on success", runWatch},
		{"cancel", "RUN", "cancel a run: its RayJob is deleted and the workers go to zero", runCancel},
		{"migrate-state", "", "copy run records and cluster leases from the intake bucket to the state bucket (once, after upgrading a deployment made before the state bucket)", runMigrateState},
		{"logs", "RUN [--attempt N] [--follow] | RUN --pod POD [--container C] [--previous] [--tail N] [--follow]", "print the Ray job's driver log of the run's current attempt (or --attempt N), kept beside the run; --follow prints new lines until the attempt ends. With --pod, a live pod's container log through the Kubernetes API server (one of the run's Ray pods or its submitter)", runLogs},
		{"diagnose", "RUN|SWEEP [--attempt N] [--json]", "say why a run failed, from its bucket alone (the cluster may be gone): the cause and what to change, the first error lines of each rank, the pods' last states and exit codes, the events, where the whole evidence lies; for a sweep, each failed trial", runDiagnose},
		{"report", "RUN [-o FILE]", "print where the run's report is (one HTML page: curves, timeline, checkpoints, samples, cost), or write it to FILE", runReport},
		{"events", "[--json] [--run ID] [--type PHASE] [--count N]", "follow the public event topic and print each event (--json: structured CloudEvents)", runEvents},
		{"dev", "", "start the local cloud and keep it up (from a raydrop checkout)", runDev},
		{"completion", "bash|zsh|fish", "print the shell completion script (commands, flags, run IDs): source <(raydrop completion bash)", runCompletion},
	}
}

// Run runs the raydrop command line args and returns its exit code.
func Run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	e := &env{stdin: stdin, stdout: stdout, stderr: stderr}
	if len(args) == 0 || args[0] == "help" || args[0] == "-h" || args[0] == "--help" {
		usage(stdout)
		if len(args) == 0 {
			return ExitUsage
		}
		return ExitOK
	}
	if args[0] == "__complete" {
		return runComplete(ctx, e, args[1:])
	}
	for _, c := range commands() {
		if c.name == args[0] {
			return c.run(ctx, e, args[1:])
		}
	}
	fmt.Fprintf(stderr, "raydrop: unknown command %q (run 'raydrop help' for the list)\n", args[0])
	return ExitUsage
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "raydrop runs fine-tuning jobs on Ray on GKE.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Usage: raydrop COMMAND [ARGS]")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Commands:")
	cs := commands()
	sort.Slice(cs, func(i, j int) bool { return cs[i].name < cs[j].name })
	for _, c := range cs {
		fmt.Fprintf(w, "  %-9s %s\n", c.name, c.summary)
	}
	fmt.Fprintln(w)
	fmt.Fprintln(w, "Run 'raydrop COMMAND --help' for a command's flags.")
}

// newFlags makes the named command's flag set with a --help that prints
// its usage.
func newFlags(e *env, name string) *flag.FlagSet {
	c := findCommand(name)
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: raydrop %s %s\n\n%s\n", c.name, c.args, c.summary)
		var b strings.Builder
		fs.SetOutput(&b)
		fs.PrintDefaults()
		fs.SetOutput(e.stderr)
		if b.Len() > 0 {
			fmt.Fprintf(fs.Output(), "\nFlags:\n%s", b.String())
		}
	}
	return fs
}

// parse parses flags that may come before or after the positional
// arguments and returns the positionals. A --help request returns
// flag.ErrHelp after printing usage to stdout.
func parse(e *env, fs *flag.FlagSet, args []string) ([]string, int, bool) {
	if e.flags != nil {
		*e.flags = fs
		return nil, ExitOK, false
	}
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				fs.SetOutput(e.stdout)
				fs.Usage()
				return nil, ExitOK, false
			}
			return nil, ExitUsage, false
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, 0, true
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

func findCommand(name string) command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	panic("cli: no command " + name)
}
