package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// ErrStreamIdle is why an answer was cut off: the worker sent nothing for
// longer than the idle timeout after its headers.
var ErrStreamIdle = errors.New("worker answer idle")

// idleReader reads a worker's answer and cancels the attempt's context
// when a read waits longer than timeout: a worker that stalls after its
// headers must not hold its slot forever. The timer runs only while a
// read waits for the worker, so a slow client (whose writes hold up the
// next read) is not taken for a silent worker. A read cut because the
// router is shutting down (ctx's cause) fails with errShutdown.
type idleReader struct {
	r       io.Reader
	ctx     context.Context // the attempt's
	timeout time.Duration
	timer   *time.Timer
	fired   atomic.Bool
}

func newIdleReader(ctx context.Context, r io.Reader, timeout time.Duration, cancel context.CancelCauseFunc) *idleReader {
	ir := &idleReader{r: r, ctx: ctx, timeout: timeout}
	ir.timer = time.AfterFunc(timeout, func() {
		ir.fired.Store(true)
		cancel(ErrStreamIdle)
	})
	ir.timer.Stop() // armed by each Read
	return ir
}

// Read reads from the answer; after the timer fired it fails with an error
// wrapping ErrStreamIdle, and after a shutdown cut it with errShutdown,
// whatever the transport made of the cancellation.
func (ir *idleReader) Read(p []byte) (int, error) {
	ir.timer.Reset(ir.timeout)
	n, err := ir.r.Read(p)
	ir.timer.Stop()
	if ir.fired.Load() {
		return n, fmt.Errorf("the worker sent nothing for %v: %w", ir.timeout, ErrStreamIdle)
	}
	if err != nil && err != io.EOF && errors.Is(context.Cause(ir.ctx), errShutdown) {
		return n, errShutdown
	}
	return n, err
}

// stop disarms the timer once the answer is relayed.
func (ir *idleReader) stop() { ir.timer.Stop() }
