package config

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/stats"
)

// TestCheck_RemovedKeysSayWhatTheRouterDoesNow holds every key taken out
// of the file to an error of its own: the key, on its line, said to be
// removed, with what the router now does in its place, never the generic
// unknown-key guess at a neighbour.
func TestCheck_RemovedKeysSayWhatTheRouterDoesNow(t *testing.T) {
	w := scheduler.DefaultWeights()
	for _, tc := range []struct {
		key, value string
		says       string // what the message must say the router does now
	}{
		{"weights.active_requests", "50", fmt.Sprint(w.ActiveRequests)},
		{"weights.queue_length", "1", fmt.Sprint(w.QueueLength)},
		{"weights.latency", "0", fmt.Sprint(w.Latency)},
		{"weights.job_cost", "0", fmt.Sprint(w.JobCost)},
		{"weights.throughput", "300", fmt.Sprint(w.Throughput)},
		{"weights.kv_pressure", "0", fmt.Sprint(w.KVPressure)},
		{"weights.gpu_util", "0", fmt.Sprint(w.GPUUtil)},
		{"limits.adaptive", "false", "always learns"},
		{"limits.floor_fraction", "0.7", "half"},
		{"limits.min_samples", "5", "after 3 streams"},
		{"limits.probe_after", "30s", "1m"},
		{"limits.borrow_after", "1s", "2s"},
		{"limits.default_cap", "16", "64"},
		{"limits.policy", "decode_first", "worse for both the first token and the decode rate"},
		{"admission.max_overtake", "3s", scheduler.DefaultMaxOvertake.String()},
		{"sessions.affinity", "false", "its last worker as holding its previous prompt"},
		{"policy", "round-robin", "sluice bench compare --policies"},
		{"hash_load_bound", "1.25", "sluice bench compare --policies"},
		{"stats.alpha", "0.5", fmt.Sprint(stats.Alpha)},
		{"stats.flush_interval", "5s", "every " + stats.FlushInterval.String()},
		{"proxy.tokenize_above", "2000", "tokens per character the workers' usage reports"},
		{"proxy.tokenize_timeout", "1s", "200ms"},
	} {
		t.Run(tc.key, func(t *testing.T) {
			yaml, line := "workers: [{name: a, url: 'http://h:1'}]\n", 3
			if section, leaf, ok := strings.Cut(tc.key, "."); ok {
				yaml += section + ":\n  " + leaf + ": " + tc.value + "\n"
			} else {
				yaml += tc.key + ": " + tc.value + "\n"
				line = 2
			}
			r := Check("sluice.yaml", []byte(yaml))
			if len(r.Problems) != 1 {
				t.Fatalf("problems %v, want one naming %s", r.Problems, tc.key)
			}
			p := r.Problems[0]
			if p.Key != tc.key || p.Line != line {
				t.Errorf("problem at %s line %d, want %s line %d", p.Key, p.Line, tc.key, line)
			}
			if !strings.HasPrefix(p.Msg, "removed; ") || strings.Contains(p.Msg, "unknown key") || !strings.Contains(p.Msg, tc.says) {
				t.Errorf("%s: %q, want \"removed; \" and what the router does now (%q)", tc.key, p.Msg, tc.says)
			}
			if !strings.HasSuffix(p.Msg, "delete the key") {
				t.Errorf("%s: %q does not say what to do", tc.key, p.Msg)
			}
			_, err := parse(yaml)
			var ps Problems
			if !errors.As(err, &ps) || !strings.Contains(err.Error(), tc.key+": removed; ") {
				t.Errorf("parse: %v, want the removed key's problem", err)
			}
		})
	}
}

// TestCheck_RemovedKeysLeaveTheirNeighbours: the keys that stay beside
// removed ones still decode.
func TestCheck_RemovedKeysLeaveTheirNeighbours(t *testing.T) {
	cfg, err := parse(`workers: [{name: a, url: 'http://h:1'}]
weights: {prefix: 0}
limits:
  min_stream_tok_s: 12
  models: {m: {min_stream_tok_s: 20}}
`)
	if err != nil {
		t.Fatal(err)
	}
	sw := cfg.Weights.Scheduler()
	want := scheduler.DefaultWeights()
	want.Prefix = 0
	if sw != want {
		t.Errorf("weights %+v, want the defaults with prefix 0 (%+v)", sw, want)
	}
	lc := cfg.Limits.Scheduler()
	if lc.Fixed || lc.MinStreamTokS != 12 || lc.ModelFloors["m"] != 20 {
		t.Errorf("limits %+v, want learned limits with floors 12 and m: 20", lc)
	}
}
