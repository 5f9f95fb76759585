package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/discovery"
)

// runConfig dispatches `sluice config <subcommand>`.
func runConfig(args []string) error {
	if len(args) == 0 || args[0] != "check" {
		return errors.New("usage: sluice config check --config FILE")
	}
	return configCheck(os.Stdout, args[1:])
}

// configCheck validates a config file without starting anything: it
// prints every problem with its key path, one a line, and fails; or says
// what the file configures and succeeds.
func configCheck(w io.Writer, args []string) error {
	fs := flag.NewFlagSet("config check", flag.ContinueOnError)
	path := fs.String("config", "", "config file to check")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" && fs.NArg() == 1 {
		*path = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if *path == "" {
		return errors.New("--config FILE is required")
	}
	cfg, err := config.Load(*path)
	if err == nil && cfg.Discovery.Kubernetes != nil {
		// The selector's syntax needs the Kubernetes label parser.
		if _, serr := discovery.ParseSelector(cfg.Discovery.Kubernetes.Selector); serr != nil {
			err = fmt.Errorf("config %s: %w", *path, serr)
		}
	}
	if err != nil {
		problems := strings.Split(err.Error(), "\n")
		for _, p := range problems {
			fmt.Fprintln(w, p)
		}
		return fmt.Errorf("%s: %d problem(s)", *path, len(problems))
	}
	kinds := map[string]int{}
	for _, wk := range cfg.Workers {
		kinds[wk.Kind]++
	}
	var parts []string
	for _, k := range config.Kinds {
		if n := kinds[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
	}
	disc := ""
	if k := cfg.Discovery.Kubernetes; k != nil {
		disc = fmt.Sprintf(", discovery from EndpointSlices %q", k.Selector)
	}
	fmt.Fprintf(w, "%s: ok: %d worker(s) (%s)%s, listen %s, policy %s\n",
		*path, len(cfg.Workers), strings.Join(parts, ", "), disc, cfg.Listen, cfg.Policy)
	return nil
}
