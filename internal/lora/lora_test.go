package lora

import (
	"errors"
	"slices"
	"testing"
	"time"
)

// A load started at a bind is held meanwhile, joined by later binds, and
// forgotten when every request bound to it left before taking its turn.
func TestHoldings_AbandonedLoadIsForgotten(t *testing.T) {
	var h Holdings
	if h.Holds("sql", nil) || h.Loading("sql") != nil {
		t.Fatal("an empty worker holds an adapter")
	}
	ld := h.Start("sql", "base")
	if !h.Holds("sql", nil) || h.Loading("sql") != ld {
		t.Fatal("a load due does not count as holding, or later binds do not join it")
	}
	h.Leave(ld)
	select {
	case <-ld.Done():
		t.Fatal("the load ended while a request was still bound to it")
	default:
	}
	h.Leave(ld)
	<-ld.Done()
	if !errors.Is(ld.Err(), ErrAbandoned) || h.Holds("sql", nil) {
		t.Fatalf("abandoned load: err %v, held %v; want ErrAbandoned and not held", ld.Err(), h.Holds("sql", nil))
	}
}

// A load whose turn was taken is the maker's to settle: the last release
// does not end it. Made, the adapter is held until the telemetry lists it,
// and from then on the telemetry alone says.
func TestHoldings_SettledLoadIsHeldUntilReported(t *testing.T) {
	var h Holdings
	now := time.Unix(100, 0)
	ld := h.Start("sql", "base")
	<-ld.Turn()
	h.Leave(ld)
	select {
	case <-ld.Done():
		t.Fatal("the last release ended a load being made")
	default:
	}
	if got := h.Loads(); len(got) != 1 || got[0] != ld || got[0].Base != "base" {
		t.Fatalf("loads %v, want the one being made", got)
	}
	h.Settle(ld, nil, now)
	<-ld.Done()
	if names, at := h.Loaded(); !slices.Equal(names, []string{"sql"}) || !at[0].Equal(now) || len(h.Loads()) != 0 {
		t.Fatalf("loaded %v at %v, loads %v; want sql loaded now and no load", names, at, h.Loads())
	}
	if !h.Holds("sql", nil) {
		t.Fatal("a loaded adapter is not held before the telemetry lists it")
	}
	if !h.Holds("sql", []Info{{Name: "sql"}}) || h.Holds("sql", nil) {
		t.Fatal("once reported, the telemetry alone should say whether it is held")
	}
	failed := h.Start("chat", "base")
	<-failed.Turn()
	h.Settle(failed, errors.New("boom"), now)
	if failed.Err() == nil || h.Holds("chat", nil) {
		t.Fatal("a failed load is held")
	}
}
