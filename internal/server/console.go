package server

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/proxy"
)

// summaryInterval is how often the console's traffic line is written
// while there is traffic: a person watching the console wants the trend
// and the warnings; each decision is in the decision log.
const summaryInterval = 10 * time.Second

// maxSummaryTTFTs bounds the times to first token one summary keeps for
// its percentiles; beyond it, later requests still count but do not add
// to the percentiles.
const maxSummaryTTFTs = 4096

// console counts the requests that ended since its last summary line.
// Observe is called from request goroutines; summary from one goroutine.
type console struct {
	mu       sync.Mutex
	requests int
	ok       int
	reasons  map[string]int // refusals and failures by X-Sluice-Reason
	ttfts    []time.Duration
	quiet    bool // the last line said nothing was happening
}

// observe counts one request that ended.
func (c *console) observe(r proxy.Result) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.requests++
	if r.Status >= 200 && r.Status < 300 {
		c.ok++
	} else {
		if c.reasons == nil {
			c.reasons = map[string]int{}
		}
		reason := r.Reason
		if reason == "" {
			reason = strconv.Itoa(r.Status)
		}
		c.reasons[reason]++
	}
	if r.TTFT > 0 && len(c.ttfts) < maxSummaryTTFTs {
		c.ttfts = append(c.ttfts, r.TTFT)
	}
}

// summary returns the attributes of the next traffic line and resets the
// counts, or false when nothing happened since a line that already said
// so: an idle router writes one line when it goes idle, then none.
// queued is the requests waiting in Sluice's queues now, inFlight the
// inference requests open now, the queued ones among them.
func (c *console) summary(queued, inFlight int) ([]slog.Attr, bool) {
	c.mu.Lock()
	requests, ok, reasons, ttfts := c.requests, c.ok, c.reasons, c.ttfts
	c.requests, c.ok, c.reasons, c.ttfts = 0, 0, nil, nil
	idle := requests == 0 && queued == 0 && inFlight == 0
	wasQuiet := c.quiet
	c.quiet = idle
	c.mu.Unlock()
	if idle && wasQuiet {
		return nil, false
	}
	attrs := []slog.Attr{
		slog.Int("requests", requests),
		slog.Int("ok", ok),
		slog.Int("errors", requests-ok),
	}
	if len(reasons) > 0 {
		var parts []string
		for _, r := range slices.Sorted(maps.Keys(reasons)) {
			parts = append(parts, r+"="+strconv.Itoa(reasons[r]))
		}
		attrs = append(attrs, slog.String("error_reasons", strings.Join(parts, ",")))
	}
	attrs = append(attrs, slog.Int("queued", queued), slog.Int("running", max(inFlight-queued, 0)))
	if len(ttfts) > 0 {
		slices.Sort(ttfts)
		attrs = append(attrs,
			slog.Int64("ttft_p50_ms", percentile(ttfts, 0.50).Milliseconds()),
			slog.Int64("ttft_p95_ms", percentile(ttfts, 0.95).Milliseconds()))
	}
	return attrs, true
}

// percentile is the nearest-rank percentile q of sorted.
func percentile(sorted []time.Duration, q float64) time.Duration {
	i := int(q*float64(len(sorted))+0.999999) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// runConsole writes a traffic line every summaryInterval (on
// s.summaryTick when set) until ctx ends.
func (s *Server) runConsole(ctx context.Context) {
	tick := s.summaryTick
	if tick == nil {
		t := time.NewTicker(summaryInterval)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
		}
		queued := 0
		for _, n := range s.sched.QueueDepths() {
			queued += n
		}
		if attrs, ok := s.console.summary(queued, int(s.inFlight.Load())); ok {
			s.log.LogAttrs(ctx, slog.LevelInfo, "traffic", attrs...)
		}
	}
}
