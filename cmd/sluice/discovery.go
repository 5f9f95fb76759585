package main

import (
	"context"
	"fmt"
	"log/slog"

	discoveryclient "k8s.io/client-go/kubernetes/typed/discovery/v1"
	"k8s.io/client-go/rest"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/discovery"
	"github.com/sluice-router/sluice/internal/server"
)

// serverSink adapts the server's admin path to discovery.Sink.
type serverSink struct{ srv *server.Server }

func (s serverSink) AddWorker(w config.Worker) error { return s.srv.AddWorker(w) }
func (s serverSink) RemoveWorker(name string) error  { return s.srv.RemoveWorker(name) }
func (s serverSink) WorkerNames() []string {
	ws := s.srv.Scheduler().Briefs()
	names := make([]string, 0, len(ws))
	for _, w := range ws {
		names = append(names, w.Name)
	}
	return names
}

// startDiscovery starts the worker discovery the config asks for, if any,
// and returns once its first set of workers is applied. It uses the pod's
// in-cluster credentials (the ServiceAccount of deploy/kubernetes).
func startDiscovery(ctx context.Context, cfg config.Config, srv *server.Server, log *slog.Logger) error {
	k := cfg.Discovery.Kubernetes
	if k == nil {
		return nil
	}
	rc, err := rest.InClusterConfig()
	if err != nil {
		return fmt.Errorf("discovery.kubernetes: not running in a pod: %w", err)
	}
	client, err := discoveryclient.NewForConfig(rc)
	if err != nil {
		return fmt.Errorf("discovery.kubernetes: %w", err)
	}
	w, err := discovery.New(*k, client, serverSink{srv}, discovery.Options{Logger: log, Namespace: discovery.OwnNamespace()})
	if err != nil {
		return err
	}
	return w.Run(ctx, nil)
}
