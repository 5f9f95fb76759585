package server

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/redisconn"
	"github.com/sluice-router/sluice/internal/shared"
)

// sharedState is the replica's handle on the state it shares with the
// other replicas of the fleet (nil fields when it runs alone).
type sharedState struct {
	rdb    *redis.Client
	ledger *shared.Ledger
	ctx    context.Context // ends the ledger's calls at shutdown
	cancel context.CancelFunc
}

// openShared connects the shared ledger when shared.redis is set. It does
// not wait for Redis: a replica starts, degraded, while Redis is down.
func openShared(cfg config.Shared, listen string, s *Server) (*sharedState, error) {
	if cfg.Redis == "" {
		return &sharedState{}, nil
	}
	replica, err := replicaName(cfg, listen)
	if err != nil {
		return nil, err
	}
	rdb, prefix, err := redisconn.Open(cfg.Redis, "")
	if err != nil {
		return nil, fmt.Errorf("shared.redis: %w", err)
	}
	l, err := shared.New(shared.Config{
		Client: rdb, Prefix: prefix, Replica: replica,
		LeaseTTL: cfg.LeaseTTL, Replicas: cfg.Replicas, Logger: s.log,
	})
	if err != nil {
		rdb.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	s.log.Info("scheduling with shared state", "replica", replica, "redis", redisconn.Redact(cfg.Redis),
		"lease_ttl", cfg.LeaseTTL, "replicas", cfg.Replicas)
	return &sharedState{rdb: rdb, ledger: l, ctx: ctx, cancel: cancel}, nil
}

// replicaName is shared.replica, else the host name and the listen port:
// unique across hosts, and among replicas started side by side on one.
func replicaName(cfg config.Shared, listen string) (string, error) {
	if cfg.Replica != "" {
		return cfg.Replica, nil
	}
	h, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("shared.replica: not set and no host name: %w", err)
	}
	replica := h
	if _, port, err := net.SplitHostPort(listen); err == nil && port != "" {
		replica += "-" + port
	}
	return strings.Map(func(r rune) rune {
		if strings.ContainsRune("|/ \t\n", r) {
			return '_'
		}
		return r
	}, replica), nil
}

// idPrefix starts decision IDs with the replica's name, so replicas started
// together never hand out the same ID.
func (st *sharedState) idPrefix() string {
	if st.ledger == nil {
		return ""
	}
	return st.ledger.Replica() + "-" + strconv.FormatInt(time.Now().UnixMilli(), 36)
}

// collectors are the shared state's metrics.
func (st *sharedState) collectors() []prometheus.Collector {
	if st.ledger == nil {
		return nil
	}
	return []prometheus.Collector{prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sluice_shared_state_degraded",
		Help: "1 while the shared state (Redis) is unavailable and this replica schedules on its local view with its share of each worker, else 0.",
	}, func() float64 {
		if st.ledger.Degraded() {
			return 1
		}
		return 0
	})}
}

// run renews the ledger and relays the other replicas' wake-ups to kick
// until ctx ends.
func (st *sharedState) run(ctx context.Context, kick func()) {
	if st.ledger == nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		st.ledger.Run(ctx)
	}()
	for {
		select {
		case <-ctx.Done():
			<-done
			return
		case <-st.ledger.Wake():
			kick()
		}
	}
}

// close ends the ledger's calls and the connection; after run returned.
func (st *sharedState) close() {
	if st.ledger == nil {
		return
	}
	st.cancel()
	st.rdb.Close()
}
