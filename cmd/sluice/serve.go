package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/server"
)

// runServe runs the router: sluice serve --config sluice.yaml.
func runServe(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	path := fs.String("config", "sluice.yaml", "configuration file")
	listen := fs.String("listen", "", "listen address (overrides the config's listen)")
	logFormat := fs.String("log-format", "", "text or json (overrides the config's log_format)")
	logLevel := fs.String("log-level", "info", "debug (also a line per decision), info (a traffic line every 10 s, and changes), warn or error")
	grace := fs.Duration("grace", 0, "how long queued and in-flight requests may finish on shutdown (overrides the config's shutdown.grace)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	load := func() (config.Config, error) { return loadServeConfig(*path, *listen, *logFormat) }
	level, err := parseLevel(*logLevel)
	if err != nil {
		return err
	}
	cfg, err := load()
	if err != nil {
		return err
	}
	log := newLogger(cfg.LogFormat, level)
	ctx, stop := signalContext()
	defer stop()
	return serve(ctx, cfg, nil, log, *grace, load)
}

// loadServeConfig reads the configuration `sluice serve` runs with: the
// file, the flags' overrides, and the averages persisted by default
// (config.DefaultStatsStore, its directory made) unless stats.store says
// where, or memory.
func loadServeConfig(path, listen, logFormat string) (config.Config, error) {
	cfg, err := config.Load(path)
	if err != nil {
		return cfg, err
	}
	if listen != "" {
		cfg.Listen = listen
	}
	if logFormat != "" {
		cfg.LogFormat = logFormat
	}
	if err := cfg.Validate(); err != nil {
		return cfg, err
	}
	if cfg.Stats.Store == "" {
		if cfg.Stats.Store, err = config.DefaultStatsStore(); err != nil {
			return cfg, err
		}
		if err := os.MkdirAll(filepath.Dir(cfg.Stats.Store), 0o755); err != nil {
			return cfg, fmt.Errorf("stats.store is not set and its default directory cannot be made (set stats.store, SLUICE_STATE_DIR, or stats.store: memory): %w", err)
		}
	}
	return cfg, nil
}

// serve runs a router for cfg until ctx ends, on ln (its caller's to close
// should serving never begin), or when ln is nil on a listener of
// cfg.Listen. reload, when not nil, is called on SIGHUP to
// re-read the configuration.
func serve(ctx context.Context, cfg config.Config, ln net.Listener, log *slog.Logger, grace time.Duration, reload func() (config.Config, error)) error {
	tracer, stopTracing, err := startTracing(ctx, cfg.Tracing, log)
	if err != nil {
		return err
	}
	defer stopTracing()
	srv, err := server.New(cfg, server.Options{Logger: log, Tracer: tracer})
	if err != nil {
		return err
	}
	defer func() {
		if err := srv.Close(); err != nil {
			log.Error("close", "err", err)
		}
	}()
	if err := startDiscovery(ctx, cfg, srv, log); err != nil {
		return err
	}
	if ln == nil {
		if ln, err = net.Listen("tcp", cfg.Listen); err != nil {
			return fmt.Errorf("listen: %w", err)
		}
	}
	log.Info("sluice listening", "addr", ln.Addr().String(), "workers", len(cfg.Workers))
	if reload != nil {
		hup := make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
		go func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-hup:
					next, err := reload()
					if err != nil {
						log.Error("reload refused: config is invalid; keeping the running one", "err", err)
						continue
					}
					if err := srv.Reload(next); err != nil {
						log.Error("reload applied with errors", "err", err)
					}
				}
			}
		}()
	}
	err = srv.Serve(ctx, ln, grace)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// newLogger logs to stderr in format (text or json) from level up.
func newLogger(format string, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if format == "json" {
		return slog.New(slog.NewJSONHandler(os.Stderr, opts))
	}
	return slog.New(slog.NewTextHandler(os.Stderr, opts))
}

// parseLevel reads --log-level.
func parseLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}
