package cli

import (
	"context"
	"flag"
	"fmt"
	"sort"
	"strings"
	"time"
)

// Shell completion: `raydrop completion bash|zsh|fish` prints a script that
// asks `raydrop __complete WORDS...` (the words typed so far, without the
// one being completed) for the candidates: the commands, then the chosen
// command's flags, and the run IDs of the deployment for the commands that
// take one (listed from the state bucket, given up after a few seconds).

// runIDCommands take a run ID as their positional argument.
var runIDCommands = map[string]bool{"status": true, "watch": true, "cancel": true, "diagnose": true}

const completeListTimeout = 3 * time.Second

// bashCompletion is the bash script; zsh runs it through bashcompinit.
const bashCompletion = `_raydrop() {
  local cur=${COMP_WORDS[COMP_CWORD]}
  local IFS=$'\n'
  COMPREPLY=($(compgen -W "$(raydrop __complete "${COMP_WORDS[@]:1:COMP_CWORD-1}" 2>/dev/null)" -- "$cur"))
}
complete -o default -F _raydrop raydrop
`

var completionScripts = map[string]string{
	"bash": "# raydrop completion for bash: source <(raydrop completion bash)\n" + bashCompletion,
	"zsh":  "# raydrop completion for zsh: source <(raydrop completion zsh)\nautoload -U +X bashcompinit && bashcompinit\n" + bashCompletion,
	"fish": `# raydrop completion for fish: raydrop completion fish | source
complete -c raydrop -f -a '(raydrop __complete (commandline -opc)[2..-1] 2>/dev/null)'
`,
}

func runCompletion(_ context.Context, e *env, args []string) int {
	fs := newFlags(e, "completion")
	pos, code, ok := parse(e, fs, args)
	if !ok {
		return code
	}
	if len(pos) != 1 || completionScripts[pos[0]] == "" {
		fmt.Fprintln(e.stderr, "raydrop completion: give one shell: bash, zsh or fish")
		return ExitUsage
	}
	fmt.Fprint(e.stdout, completionScripts[pos[0]])
	return ExitOK
}

// runComplete prints the candidates for the word after words, one a line.
func runComplete(ctx context.Context, e *env, words []string) int {
	if len(words) == 0 {
		for _, c := range commands() {
			fmt.Fprintln(e.stdout, c.name)
		}
		fmt.Fprintln(e.stdout, "help")
		return ExitOK
	}
	name := words[0]
	var cmd *command
	for _, c := range commands() {
		if c.name == name {
			cmd = &c
		}
	}
	if cmd == nil {
		return ExitOK
	}
	// The command's own flag set, captured as its parse sees it; the
	// command stops there and does nothing.
	capture := &env{stdin: e.stdin, stdout: discard{}, stderr: discard{}, flags: new(*flag.FlagSet)}
	cmd.run(ctx, capture, nil)
	fs := *capture.flags
	if fs == nil {
		return ExitOK
	}
	if prev := words[len(words)-1]; strings.HasPrefix(prev, "-") && !strings.Contains(prev, "=") {
		if f := fs.Lookup(strings.TrimLeft(prev, "-")); f != nil && !isBool(f) {
			return ExitOK // the word is that flag's value
		}
	}
	var out []string
	fs.VisitAll(func(f *flag.Flag) { out = append(out, "--"+f.Name) })
	sort.Strings(out)
	if runIDCommands[name] {
		out = append(out, runIDs(ctx, e)...)
	}
	for _, s := range out {
		fmt.Fprintln(e.stdout, s)
	}
	return ExitOK
}

// runIDs lists the deployment's runs, newest first; none when the state
// bucket cannot be read in time.
func runIDs(ctx context.Context, e *env) []string {
	ctx, cancel := context.WithTimeout(ctx, completeListTimeout)
	defer cancel()
	t := &target{}
	t.flags(flag.NewFlagSet("complete", flag.ContinueOnError))
	st, done, err := t.store(ctx)
	if err != nil {
		return nil
	}
	defer done()
	sums, err := st.List(ctx)
	if err != nil {
		return nil
	}
	sort.Slice(sums, func(i, j int) bool { return sums[i].Updated.After(sums[j].Updated) })
	ids := make([]string, 0, len(sums))
	for _, s := range sums {
		ids = append(ids, s.RunID)
	}
	return ids
}

func isBool(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }
