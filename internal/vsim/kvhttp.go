package vsim

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/kvevents"
	"github.com/sluice-router/sluice/internal/server"
)

// KVState is one worker's index of KV events in a router at the end of a
// real-HTTP run (HTTPConfig.KVEvents), as GET /api/workers shows it.
type KVState struct {
	Worker string
	kvevents.Stats
	// Gaps counts the seq gaps the subscriber saw, Replays those the
	// replay socket repaired.
	Gaps, Replays int
}

// joinKVEvents waits until srv's subscriber to each worker's KV events
// has had a batch. A ZeroMQ PUB socket drops what it sends before a
// subscriber has joined and an idle worker sends nothing, so each
// worker's prefix cache (empty: the load has not started) is reset with
// vLLM's POST /reset_prefix_cache, which publishes AllBlocksCleared,
// every 20 ms until its batch has arrived (kvevents.Join); at most 30 s.
func joinKVEvents(ctx context.Context, srv *server.Server, ws []config.Worker) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	reset := func() {
		for _, w := range ws {
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.URL+"/reset_prefix_cache", nil)
			if err != nil {
				continue
			}
			if resp, err := client.Do(req); err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		}
	}
	return kvevents.Join(ctx, reset, func(ctx context.Context) error {
		for _, w := range ws {
			if err := srv.WaitKVEvents(ctx, w.Name, kvevents.HasBatch); err != nil {
				return fmt.Errorf("vsim: http: %s's KV events never reached the router: %w", w.Name, err)
			}
		}
		return nil
	})
}

// collectKV reads, from srv's bound decisions, how many read the exact
// index on the chosen worker, and each worker's index state.
func collectKV(st *HTTPStats, srv *server.Server, recs []*decisions.Record) {
	for _, rec := range recs {
		if rec.Chosen == "" {
			continue
		}
		for _, c := range rec.Explain().Candidates {
			if c.Worker != rec.Chosen {
				continue
			}
			for _, tm := range c.Terms {
				if tm.Name == "prefix" && strings.HasPrefix(tm.Source, "vLLM KV events") {
					st.KVDecisions++
				}
			}
		}
	}
	for _, w := range st.Workers {
		ks, gaps, replays, ok := srv.KVEventsState(w.Name)
		if ok {
			st.KV = append(st.KV, KVState{Worker: w.Name, Stats: ks, Gaps: gaps, Replays: replays})
		}
	}
}
