package main

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestDemoShare_CrossesCapacityWithinTwoMinutesAndFallsBack holds the
// demo's load to what it is for: it starts under the fleet's capacity,
// passes it within the first two minutes (so a request waits in Sluice's
// queue while someone is still watching) and falls back under it, so the
// queue drains and the cycle shows again.
func TestDemoShare_CrossesCapacityWithinTwoMinutesAndFallsBack(t *testing.T) {
	if got := demoShare(0); got > 0.6 {
		t.Errorf("the load starts at %.2f of capacity, want well under it", got)
	}
	over := time.Duration(-1)
	for at := time.Duration(0); at <= 2*time.Minute; at += time.Second {
		if demoShare(at) > 1.05 {
			over = at
			break
		}
	}
	if over < 0 {
		t.Fatalf("the load stays under 1.05 of capacity for the first two minutes: peak %.2f", demoShare(2*time.Minute))
	}
	if got, want := demoOverCapacity(), over; got > want || got < want-time.Minute {
		t.Errorf("demoOverCapacity() = %v, but the load passes 1.05 of capacity at %v", got, want)
	}
	if got := demoShare(demoOverCapacity()); got < 0.99 || got > 1.01 {
		t.Errorf("at demoOverCapacity() the load is %.3f of capacity, want 1", got)
	}
	var under time.Duration
	for at := over; at < over+demoCycle; at += time.Second {
		if demoShare(at) < 0.9 {
			under = at
			break
		}
	}
	if under == 0 {
		t.Fatal("the load never falls back under 0.9 of capacity")
	}
	if under-over > demoCycle/2 {
		t.Errorf("the load stays over capacity from %v to %v, over half the cycle: the queue would not drain", over, under)
	}
	if got, want := demoShare(demoCycle+over), demoShare(over); got != want {
		t.Errorf("the cycle does not repeat: %.3f after one cycle, %.3f before", got, want)
	}
}

// TestDemo_HoldsARequestWithoutFlags runs the demo as a newcomer would,
// with no flag about load (only a faster clock, so two simulated minutes
// pass in twelve seconds), and checks that within those two minutes a
// request waited in Sluice's queue and was then bound to a worker.
func TestDemo_HoldsARequestWithoutFlags(t *testing.T) {
	const scale = 10
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	state := t.TempDir()
	start := time.Now()
	if err := runDemo([]string{"--listen", addr, "--duration", "13s", "--time-scale", "10", "--quiet", "--state", state}); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join(state, "decisions.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var n, held int
	var first time.Time
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var rec struct {
			Time        time.Time `json:"time"`
			Outcome     string    `json:"outcome"`
			Chosen      string    `json:"chosen"`
			QueueWaitMs float64   `json:"queue_wait_ms"`
		}
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			t.Fatal(err)
		}
		n++
		if first.IsZero() && rec.Outcome == "bound" && rec.QueueWaitMs > 0 && rec.Chosen != "" {
			first = rec.Time
		}
		if rec.QueueWaitMs > 0 && rec.Outcome == "bound" {
			held++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if first.IsZero() {
		t.Fatalf("the demo made %d decisions and none waited in Sluice's queue", n)
	}
	if at, limit := first.Sub(start), 2*time.Minute/scale; at > limit {
		t.Errorf("the first request held in the queue was bound %v in; want within two simulated minutes (%v)", at, limit)
	}
	t.Logf("%d decisions, %d bound after waiting; the first bound %v in", n, held, first.Sub(start))
}
