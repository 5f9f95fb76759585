package kvevents

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
)

// Join pokes until wait returns, returns wait's answer, and pokes no more
// once it has returned.
func TestJoin_PokesUntilWaitReturns(t *testing.T) {
	pokes := make(chan struct{}, 1)
	var n, after atomic.Int32
	var returned atomic.Bool
	poke := func() {
		if returned.Load() {
			after.Add(1)
		}
		n.Add(1)
		select {
		case pokes <- struct{}{}:
		default:
		}
	}
	errLate := errors.New("late")
	err := Join(context.Background(), poke, func(context.Context) error {
		for range 3 { // the third poke arrives on the publisher's tick
			<-pokes
		}
		return errLate
	})
	returned.Store(true)
	if !errors.Is(err, errLate) {
		t.Errorf("Join returned %v, want wait's error", err)
	}
	if n.Load() < 3 {
		t.Errorf("poked %d times, want at least the 3 wait took", n.Load())
	}
	if after.Load() != 0 {
		t.Errorf("poked %d times after Join returned", after.Load())
	}
	// A cancelled context stops the pokes; wait decides what Join says.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Join(ctx, func() {}, func(ctx context.Context) error { return ctx.Err() }); !errors.Is(err, context.Canceled) {
		t.Errorf("Join with a cancelled context: %v", err)
	}
}
