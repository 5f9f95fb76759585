package main

import (
	"context"
	"log/slog"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/tracing"
)

// startTracing returns the proxy's tracer when tracing.otlp_endpoint is
// set (nil otherwise) and a function that flushes and stops the exporter.
func startTracing(ctx context.Context, cfg config.Tracing, log *slog.Logger) (proxy.Tracer, func(), error) {
	if cfg.OTLPEndpoint == "" {
		return nil, func() {}, nil
	}
	p, err := tracing.NewOTLP(ctx, cfg.OTLPEndpoint, cfg.ServiceName, cfg.SampleRatio)
	if err != nil {
		return nil, nil, err
	}
	log.Info("tracing to OTLP collector", "endpoint", cfg.OTLPEndpoint, "sample_ratio", cfg.SampleRatio)
	stop := func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.Shutdown(ctx); err != nil {
			log.Warn("tracing shutdown", "err", err)
		}
	}
	return tracing.New(p), stop, nil
}
