package server

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/prefix"
	"github.com/sluice-router/sluice/internal/prefixshare"
	"github.com/sluice-router/sluice/internal/redisconn"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// A shared index is what the scheduler takes of a local one: matches,
// records, and sizing from the workers' reported KV caches.
var (
	_ scheduler.PrefixIndex    = (*prefixshare.Index)(nil)
	_ scheduler.PrefixCapacity = (*prefixshare.Index)(nil)
)

// openPrefixShare shares the prefix index with the other replicas when the
// router keeps its state in Redis: on the shared ledger's Redis
// (shared.redis), else on the stats store's (a redis:// stats.store). With
// neither — alone, or with a bbolt file — the index stays in the process
// and nil is returned.
func openPrefixShare(cfg config.Config, local *prefix.Index, s *Server) (*prefixshare.Index, error) {
	url, keyPrefix, what := cfg.Shared.Redis, "", "shared.redis"
	if url == "" {
		if !redisconn.IsURL(cfg.Stats.Store) {
			return nil, nil
		}
		url, keyPrefix, what = cfg.Stats.Store, cfg.Stats.RedisPrefix, "stats.store"
	}
	opts, p, err := redisconn.Parse(url, keyPrefix)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	replica, err := replicaName(cfg.Shared, cfg.Listen)
	if err != nil {
		return nil, err
	}
	x, err := prefixshare.New(prefixshare.Config{Redis: opts, Prefix: p, Replica: replica, Local: local, Logger: s.log})
	if err != nil {
		return nil, err
	}
	s.log.Info("prefix index shared with the other replicas", "replica", replica, "redis", redisconn.Redact(url), "stream", x.Key())
	return x, nil
}

// prefixShareCollectors are the shared prefix index's metrics.
func prefixShareCollectors(x *prefixshare.Index) []prometheus.Collector {
	if x == nil {
		return nil
	}
	dropped := func(reason string, v func(prefixshare.Stats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name:        "sluice_prefix_share_dropped_total",
			Help:        "Prefix index records of this replica the other replicas never got: queue_full (the publish queue was full), redis_error (the publish failed).",
			ConstLabels: prometheus.Labels{"reason": reason},
		}, func() float64 { return float64(v(x.Stats())) })
	}
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_prefix_share_published_total",
			Help: "Prefix index records of this replica appended to the shared stream in Redis.",
		}, func() float64 { return float64(x.Stats().Published) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "sluice_prefix_share_applied_total",
			Help: "Other replicas' prefix index records applied to this replica's index.",
		}, func() float64 { return float64(x.Stats().Applied) }),
		dropped("queue_full", func(s prefixshare.Stats) uint64 { return s.Dropped }),
		dropped("redis_error", func(s prefixshare.Stats) uint64 { return s.Failed }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_prefix_share_lag_seconds",
			Help: "Replication lag: time from the last applied record's append to the stream (Redis's clock, to the millisecond) to its application here. It holds its last value while nothing arrives.",
		}, func() float64 { return x.Stats().Lag.Seconds() }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "sluice_prefix_share_up",
			Help: "1 while the last call of the prefix index sharing into Redis succeeded, else 0 (picks then use this replica's own index alone).",
		}, func() float64 {
			if x.Stats().Up {
				return 1
			}
			return 0
		}),
	}
}
