package limit

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/stats"
)

// levels builds worker stats from per-level (mean, sd, samples), updated
// at at.
func levels(at time.Time, ls ...[3]float64) stats.WorkerStats {
	var out []stats.Level
	for _, l := range ls {
		mean, sd, n := l[0], l[1], int64(l[2])
		out = append(out, stats.Level{
			DecodeTPS: stats.EMA{Value: mean, N: n},
			DecodeSq:  stats.EMA{Value: mean*mean + sd*sd, N: n},
			Updated:   at,
		})
	}
	return stats.WorkerStats{Levels: stats.NewLevels(out...)}
}

// withTTFT sets each level's mean time to first token (ms) and the
// worker's mean end-to-end time.
func withTTFT(ws stats.WorkerStats, e2eMs float64, ttftMs ...float64) stats.WorkerStats {
	for i, v := range ttftMs {
		ws.Levels = ws.Levels.With(i+1, func(l *stats.Level) { l.TTFTMs = stats.EMA{Value: v, N: l.DecodeTPS.N} })
	}
	ws.E2EMs = stats.EMA{Value: e2eMs, N: 9}
	return ws
}

// learning is the config the cases run under: floor 50 tok/s, three
// samples to judge a level, verdicts that last a minute.
func learning() *Config {
	c := Config{MinStreamTokS: 50, MinSamples: 3, ProbeAfter: time.Minute}.WithDefaults()
	return &c
}

// A limit stays at the cap until a level is measured worse for both the
// decode rate (under the floor) and the first token (slower than waiting
// at one stream fewer: that level's TTFT plus the worker's mean
// end-to-end time over its streams).
func TestOf_TTFTFirstLowersOnlyWhereBothAreWorse(t *testing.T) {
	now := time.Unix(10000, 0)
	under := levels(now, [3]float64{80, 1, 5}, [3]float64{70, 2, 5}, [3]float64{40, 2, 5})
	staleUnder := levels(now.Add(-2*time.Minute), [3]float64{80, 1, 5}, [3]float64{70, 2, 5}, [3]float64{40, 2, 5})
	for _, tt := range []struct {
		name   string
		stats  stats.WorkerStats
		want   int
		reason string
	}{
		{"no history: the cap", stats.WorkerStats{}, 4, "no level measured worse"},
		{"solo only: the cap", levels(now, [3]float64{80, 1, 5}), 4, "no level measured worse"},
		{"under the floor, TTFT unknown: the cap", under, 4, "no level measured worse"},
		// At 3 streams TTFT 500 ms; held at 2 it would be 300 + 1000/2 = 800.
		{"under the floor, first token sooner than waiting: the cap", withTTFT(under, 1000, 200, 300, 500), 4, "no level measured worse"},
		// At 3 streams TTFT 900 ms; held at 2: 300 + 400/2 = 500.
		{"under the floor and slower than waiting: one below", withTTFT(under, 400, 200, 300, 900), 2, "first tokens take 900 ms there against 500 ms held at 2"},
		{"a stale verdict is probed again", withTTFT(staleUnder, 400, 200, 300, 900), 3, "re-probing"},
		{"alone under the floor: the cap", withTTFT(levels(now, [3]float64{30, 1, 5}), 400, 200), 4, "no level measured worse"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			st := learning().Of(Input{Cap: 4, Source: FromConfig, Stats: &tt.stats, Floor: 50, Now: now})
			if st.Limit != tt.want || st.Learned != tt.want || st.Source != Learned {
				t.Fatalf("limit %d learned %d source %v, want %d learned (%s)", st.Limit, st.Learned, st.Source, tt.want, st)
			}
			if !strings.Contains(st.String(), tt.reason) {
				t.Fatalf("reason %q, want it to contain %q", st, tt.reason)
			}
		})
	}
}

// Telemetry that says the worker is saturated holds it at what it runs,
// and a queue's wait lends one stream per BorrowAfter up to the cap.
func TestOf_SaturationAndBorrowing(t *testing.T) {
	now := time.Unix(10000, 0)
	bad := withTTFT(levels(now, [3]float64{80, 1, 5}, [3]float64{30, 1, 5}), 400, 200, 900) // learned 1
	c := learning()
	st := c.Of(Input{Cap: 4, Active: 2, Stats: &stats.WorkerStats{}, Floor: 50, Now: now, Sat: SatKV, SatVal: 0.97})
	if st.Limit != 2 || st.Learned != 4 || !strings.Contains(st.String(), "KV cache 97% full") {
		t.Fatalf("saturated: limit %d learned %d (%s), want 2 and 4", st.Limit, st.Learned, st)
	}
	st = c.Of(Input{Cap: 4, Stats: &bad, Floor: 50, Now: now, Waited: 5 * time.Second})
	if st.Limit != 3 || st.Learned != 1 || !strings.Contains(st.String(), "borrowing +2: the oldest queued request waited 5.0s") {
		t.Fatalf("borrowing: limit %d learned %d (%s), want 3 and 1", st.Limit, st.Learned, st)
	}
	st = c.Of(Input{Cap: 4, Stats: &bad, Floor: 50, Now: now, Waited: time.Hour})
	if st.Limit != 4 {
		t.Fatalf("borrowing past the cap: limit %d, want the cap 4", st.Limit)
	}
}

// Learning off, a limit is the cap, from max_concurrency, the reported
// slots, else 1.
func TestCap_Fixed(t *testing.T) {
	c := Config{Fixed: true}.WithDefaults()
	for _, tt := range []struct {
		maxC, slots, want int
		src               Source
	}{{3, 8, 3, FromConfig}, {0, 8, 8, FromSlots}, {0, 0, 1, FromDefault}} {
		n, src := c.Cap(tt.maxC, tt.slots)
		st := c.Of(Input{Cap: n, Source: src})
		if st.Limit != tt.want || st.Source != tt.src || st.String() != fmt.Sprintf("fixed at %d (%s)", tt.want, tt.src) {
			t.Fatalf("Cap(%d, %d): %d %v %q, want %d from %v", tt.maxC, tt.slots, st.Limit, st.Source, st, tt.want, tt.src)
		}
	}
	if n, src := learning().Cap(0, 0); n != 64 || src != FromDefault {
		t.Fatalf("learning with nothing reported: cap %d from %v, want 64 by default", n, src)
	}
}

// The floor is the configured one, per model first, else FloorFraction of
// the best solo rate.
func TestFloor(t *testing.T) {
	c := Config{ModelFloors: map[string]float64{"big": 20}}.WithDefaults()
	solo := levels(time.Unix(0, 0), [3]float64{80, 1, 5})
	best := BestSolo(BestSolo(0, &stats.WorkerStats{}), &solo)
	if got := c.Floor("big", best); got != 20 {
		t.Fatalf("floor of big %v, want the configured 20", got)
	}
	if got := c.Floor("small", best); got != 40 {
		t.Fatalf("floor of small %v, want half the best solo rate 80", got)
	}
	c.MinStreamTokS = 30
	if got := c.Floor("small", best); got != 30 {
		t.Fatalf("floor of small %v, want min_stream_tok_s 30", got)
	}
}

// A Move changes only when the learned limit does.
func TestMove_Note(t *testing.T) {
	var m Move
	t0 := time.Unix(100, 0)
	m.Note(&State{Source: FromConfig, Learned: 3}, t0)
	if m.Known {
		t.Fatal("a fixed limit was noted as learned")
	}
	m.Note(&State{Source: Learned, Learned: 8}, t0)
	m.Note(&State{Source: Learned, Learned: 8}, t0.Add(time.Second))
	if !m.Known || m.From != 8 || !m.At.Equal(t0) {
		t.Fatalf("first note %+v, want from 8 at t0", m)
	}
	m.Note(&State{Source: Learned, Learned: 2}, t0.Add(time.Minute))
	if m.From != 8 || m.State.Learned != 2 || !m.At.Equal(t0.Add(time.Minute)) {
		t.Fatalf("move %+v, want from 8 to 2 a minute on", m)
	}
}

// The borrow step is due when the oldest wait reaches the next multiple
// of BorrowAfter.
func TestStepIn(t *testing.T) {
	c := Config{BorrowAfter: 2 * time.Second}
	for waited, want := range map[time.Duration]time.Duration{0: 2 * time.Second, 500 * time.Millisecond: 1500 * time.Millisecond, 4 * time.Second: 2 * time.Second} {
		if got := c.StepIn(waited); got != want {
			t.Fatalf("StepIn(%v) = %v, want %v", waited, got, want)
		}
	}
}
