package scheduler

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// Gauges and Briefs say of each worker what Workers says, limits included
// (learned, borrowing under a backlog, floors per model), without its
// explanations.
func TestGauges_SayWhatWorkersSays(t *testing.T) {
	now := time.Unix(10000, 0)
	clock := &fakeClock{t: now}
	fs := fakeStats{
		"w0": withTTFT(levels(now, [3]float64{100, 5, 5}, [3]float64{90, 5, 5}, [3]float64{30, 5, 5}), 400, 200, 300, 900),
		"w1": levels(now, [3]float64{80, 5, 5}),
		"w2": levels(now, [3]float64{40, 5, 5}, [3]float64{10, 5, 5}),
	}
	s := newSched(t, Config{MaxQueue: 10, Stats: fs, Clock: clock,
		Limits: limit.Config{MinSamples: 3, ProbeAfter: time.Hour, BorrowAfter: time.Second}},
		WorkerSpec{Name: "w0", Models: []string{"m"}, MaxConcurrency: 8},
		WorkerSpec{Name: "w1", Models: []string{"m"}, MaxConcurrency: 1},
		WorkerSpec{Name: "w2", Models: []string{"n"}, MaxConcurrency: 4, Source: newSource(snapshot.Snapshot{Health: snapshot.HealthOK, Slots: 3})},
		WorkerSpec{Name: "w3", Models: []string{"n"}, MaxConcurrency: 2})
	if err := s.SetDraining("w3", true); err != nil {
		t.Fatal(err)
	}
	var queued []*Ticket
	for range 6 { // more than the learned limits take: some wait
		queued = append(queued, s.Submit(Request{Model: "m"}, nil))
	}
	clock.t = clock.t.Add(3 * time.Second) // they may borrow now
	type nums struct {
		Name                               string
		Models                             []string
		Health                             snapshot.Health
		Eligible, Draining                 bool
		Active, Other, Limit, Learned, Cap int
		Floor                              float64
		Snapshot                           *snapshot.Snapshot
	}
	var fromWorkers, fromGauges, fromBriefs []nums
	for _, w := range s.Workers() {
		fromWorkers = append(fromWorkers, nums{w.Name, w.Models, w.Health, !w.Draining && (w.Health == snapshot.HealthOK || w.Health == snapshot.HealthUnknown), w.Draining,
			w.Active, w.OtherReplicas, w.Limit, w.Learned, w.Cap, w.Floor, w.Snapshot})
	}
	for _, g := range s.Gauges() {
		fromGauges = append(fromGauges, nums{g.Name, g.Models, g.Health, g.Eligible(), g.Draining,
			g.Active, g.OtherReplicas, g.Limit, g.Learned, g.Cap, g.Floor, g.Snapshot})
	}
	for _, b := range s.Briefs() {
		fromBriefs = append(fromBriefs, nums{Name: b.Name, Models: b.Models, Health: b.Health, Eligible: b.Eligible(), Draining: b.Draining})
	}
	if diff := cmp.Diff(fromWorkers, fromGauges); diff != "" {
		t.Fatalf("Gauges differ from Workers (-Workers +Gauges):\n%s", diff)
	}
	briefOf := func(ns []nums) []nums {
		var out []nums
		for _, n := range ns {
			out = append(out, nums{Name: n.Name, Models: n.Models, Health: n.Health, Eligible: n.Eligible, Draining: n.Draining})
		}
		return out
	}
	if diff := cmp.Diff(briefOf(fromWorkers), fromBriefs); diff != "" {
		t.Fatalf("Briefs differ from Workers (-Workers +Briefs):\n%s", diff)
	}
	// The case is one where limits are learned and borrowed over under a
	// backlog, and each model has its floor: else the comparison shows
	// little.
	if g := fromGauges; g[0].Limit <= g[0].Learned || g[0].Floor == g[2].Floor || g[2].Floor == 0 || s.QueueDepth("m") == 0 {
		t.Fatalf("the case does not exercise borrowing and floors per model: %+v", g)
	}
	for _, q := range queued {
		s.Cancel(q, ErrClientGone)
	}
}
