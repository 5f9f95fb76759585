// Command sluice is an admission-controlling router for LLM inference
// workers, plus the tools around it: a simulated GPU worker, a demo and a
// benchmark harness. Each subcommand lives in a file of its own; main only
// dispatches.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
)

// subcommands maps each subcommand name to the function that runs it with
// the remaining arguments.
var subcommands = map[string]struct {
	run     func(args []string) error
	summary string
}{
	"serve":   {runServe, "run the router (sluice serve --config sluice.yaml)"},
	"sim":     {runSim, "run simulated llama-server workers"},
	"demo":    {runDemo, "start a simulated fleet and the router in front of it"},
	"bench":   {runBench, "measure latency predictability (bench run | bench compare | bench plan)"},
	"config":  {runConfig, "validate a config file without starting (config check --config FILE)"},
	"version": {runVersion, "print the version and build details"},
}

func usage(w io.Writer) {
	fmt.Fprintln(w, "usage: sluice <command> [flags]\n\ncommands:")
	for _, name := range []string{"demo", "serve", "sim", "bench", "config", "version"} {
		fmt.Fprintf(w, "  %-7s %s\n", name, subcommands[name].summary)
	}
	fmt.Fprintln(w, "\nrun 'sluice <command> -h' for a command's flags")
}

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run runs the command line args (without the program name) and returns
// the exit code. Help asked for is the output asked for: stdout, exit 0
// (so `sluice --help | less` shows it). No command at all is a command
// line that cannot run, as an unknown command is: the usage on stderr and
// exit 2, the convention of flag and of most CLIs, so a script that
// forgot its argument fails instead of carrying on.
func run(args []string, stdout, stderr io.Writer) int {
	if len(args) < 1 {
		usage(stderr)
		return 2
	}
	cmd, ok := subcommands[args[0]]
	if !ok {
		if args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
			usage(stdout)
			return 0
		}
		fmt.Fprintf(stderr, "sluice: unknown command %q\n\n", args[0])
		usage(stderr)
		return 2
	}
	if err := cmd.run(args[1:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		fmt.Fprintf(stderr, "sluice %s: %v\n", args[0], err)
		return 1
	}
	return 0
}
