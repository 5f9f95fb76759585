package scheduler

import (
	"context"
	"errors"
	"strings"
	"testing"
)

// A request for a route some workers' engines lack goes to one that has
// it, and the record says why the other was passed over; when no worker
// of the model serves the route the request is refused at once, not
// queued until it times out.
func TestRouteFilter_KeepsOutEnginesWithoutTheRoute(t *testing.T) {
	s := newSched(t, Config{MaxQueue: 4},
		WorkerSpec{Name: "tgi", Models: []string{"m"}, MaxConcurrency: 4, Unserved: []string{"/v1/messages"}},
		WorkerSpec{Name: "llama", Models: []string{"m"}, MaxConcurrency: 4},
		WorkerSpec{Name: "only-tgi", Models: []string{"n"}, MaxConcurrency: 4, Unserved: []string{"/v1/messages"}})
	ctx := context.Background()

	l, err := s.Admit(ctx, Request{Model: "m", Route: "/v1/messages"})
	if err != nil || l.Worker != "llama" {
		t.Fatalf("/v1/messages on %v (%v), want llama: tgi does not serve it", l, err)
	}
	var why string
	for _, c := range l.Decision.Explain().Candidates {
		if c.Worker == "tgi" {
			why = c.Why
		}
	}
	if !strings.Contains(why, "does not serve /v1/messages") {
		t.Errorf("record says of tgi %q, want that it does not serve /v1/messages", why)
	}
	l.Release()

	// Without a route (chat completions) both are eligible: tgi, listed
	// first, takes it.
	if l, err := s.Admit(ctx, Request{Model: "m"}); err != nil || l.Worker != "tgi" {
		t.Fatalf("chat request on %v (%v), want tgi", l, err)
	} else {
		l.Release()
	}

	_, err = s.Admit(ctx, Request{Model: "n", Route: "/v1/messages"})
	var ref *Refusal
	if !errors.Is(err, ErrRouteNotServed) || !errors.As(err, &ref) || ref.Reason != "route_not_served" {
		t.Fatalf("model n on /v1/messages: %v, want ErrRouteNotServed (route_not_served)", err)
	}
}
