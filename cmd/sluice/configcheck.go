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
	"github.com/sluice-router/sluice/internal/fleet"
)

// runConfig dispatches `sluice config <subcommand>`.
func runConfig(args []string) error {
	if len(args) == 0 || args[0] != "check" {
		return errors.New("usage: sluice config check --config FILE")
	}
	return configCheck(os.Stdout, args[1:])
}

// configCheck validates a config file without starting anything: it
// prints every problem in the file, one a line as FILE:LINE: key: what is
// wrong, and fails saying how many; or says what the file configures and
// succeeds. A problem does not hide the others: a value of the wrong type
// keeps its default and everything else is still checked.
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
	data, err := os.ReadFile(*path)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	rep := config.Check(*path, data)
	cfg := rep.Config
	if k := cfg.Discovery.Kubernetes; k != nil && strings.TrimSpace(k.Selector) != "" {
		// The selector's syntax needs the Kubernetes label parser.
		if _, err := discovery.ParseSelector(k.Selector); err != nil {
			var p *config.Problem
			if !errors.As(err, &p) {
				p = &config.Problem{Key: "discovery.kubernetes.selector", Msg: err.Error()}
			}
			rep.Add(p)
		}
	}
	if n := len(rep.Problems); n > 0 {
		for _, p := range rep.Problems {
			fmt.Fprintln(w, p)
		}
		return fmt.Errorf("%s: %d problem(s)", *path, n)
	}
	kinds := map[string]int{}
	for _, wk := range cfg.Workers {
		kinds[wk.Kind]++
	}
	var parts []string
	for _, k := range fleet.Kinds {
		if n := kinds[k]; n > 0 {
			parts = append(parts, fmt.Sprintf("%d %s", n, k))
		}
	}
	disc := ""
	if k := cfg.Discovery.Kubernetes; k != nil {
		disc = fmt.Sprintf(", discovery from EndpointSlices %q", k.Selector)
	}
	fmt.Fprintf(w, "%s: ok: %d worker(s) (%s)%s, listen %s\n",
		*path, len(cfg.Workers), strings.Join(parts, ", "), disc, cfg.Listen)
	return nil
}
