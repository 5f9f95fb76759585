package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/sluice-router/sluice/internal/server"
)

// signalContext returns a context that ends on SIGINT or SIGTERM, and the
// function that stops listening. Ctrl-C (SIGINT) ends it with
// server.ErrInterrupted as its cause: a person at a terminal, with no load
// balancer to wait for, so an idle router stops at once. SIGTERM, what an
// orchestrator sends, ends it with a cause that keeps the drain delay.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	go func() {
		select {
		case sig := <-ch:
			if sig == os.Interrupt {
				cancel(server.ErrInterrupted)
			} else {
				cancel(fmt.Errorf("%v received", sig))
			}
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		cancel(nil)
	}
}
