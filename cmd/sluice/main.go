// Command sluice is an admission-controlling router for LLM inference
// workers, plus the tools around it: a simulated GPU worker, a demo and a
// benchmark harness. Each subcommand lives in a file of its own; main only
// dispatches.
package main

import (
	"errors"
	"flag"
	"fmt"
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

func usage() {
	fmt.Fprintln(os.Stderr, "usage: sluice <command> [flags]\n\ncommands:")
	for _, name := range []string{"demo", "serve", "sim", "bench", "config", "version"} {
		fmt.Fprintf(os.Stderr, "  %-7s %s\n", name, subcommands[name].summary)
	}
	fmt.Fprintln(os.Stderr, "\nrun 'sluice <command> -h' for a command's flags")
}

func main() {
	if len(os.Args) < 2 {
		usage()
		os.Exit(2)
	}
	cmd, ok := subcommands[os.Args[1]]
	if !ok {
		if os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
			usage()
			return
		}
		fmt.Fprintf(os.Stderr, "sluice: unknown command %q\n\n", os.Args[1])
		usage()
		os.Exit(2)
	}
	if err := cmd.run(os.Args[2:]); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		fmt.Fprintf(os.Stderr, "sluice %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}
