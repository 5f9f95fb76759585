package kvevents

import (
	"context"
	"time"
)

// Join calls poke every 20 ms until wait returns, and returns what wait
// returned. A ZeroMQ subscriber misses what a PUB socket sends before it
// has joined (ZeroMQ's slow joiner), and an idle publisher sends nothing,
// so whoever must know a subscription receives batches before going on
// makes the publisher send something — an empty batch, or a worker's
// AllBlocksCleared at POST /reset_prefix_cache — until wait has seen one.
// poke runs first at once, then on each tick; Join returns only after
// poke's last call has returned.
func Join(ctx context.Context, poke func(), wait func(context.Context) error) error {
	joined, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			poke()
			select {
			case <-joined:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	err := wait(ctx)
	close(joined)
	<-done
	return err
}

// HasBatch is the condition of a subscription that has received a
// batch, for Index.Wait after Join.
func HasBatch(s Stats) bool { return s.Seq >= 0 }
