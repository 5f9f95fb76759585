package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Subscriber follows one worker's KV-event publisher into an Index.
type Subscriber struct {
	// Worker names the worker in the index.
	Worker string
	// Endpoint is the PUB socket, tcp://host:port; Replay the ROUTER
	// replay socket, "" when there is none.
	Endpoint, Replay string
	// Index receives the batches.
	Index *Index
	// Logger receives gaps and errors; nil discards them.
	Logger *slog.Logger
	// ReplayTimeout bounds one replay; 2s when 0.
	ReplayTimeout time.Duration

	mu      sync.Mutex
	last    int64 // the last seq applied; -1 before any
	replays int
	gaps    int
}

// Counts returns how many gaps the subscriber saw and how many replays
// repaired one.
func (s *Subscriber) Counts() (gaps, replays int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gaps, s.replays
}

// Run subscribes and applies batches until ctx ends. It returns ctx's
// error, or the socket's when it cannot dial.
func (s *Subscriber) Run(ctx context.Context) error {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	s.last = -1
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(250*time.Millisecond), zmq4.WithAutomaticReconnect(true))
	defer sub.Close()
	if err := sub.Dial(s.Endpoint); err != nil {
		return fmt.Errorf("kvevents: dial %s: %w", s.Endpoint, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return err
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			s.Logger.Warn("KV events: receive failed", "worker", s.Worker, "err", err)
			continue
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			s.Logger.Warn("KV events: message is not (topic, seq, payload)", "worker", s.Worker, "frames", len(msg.Frames))
			continue
		}
		s.handle(ctx, int64(binary.BigEndian.Uint64(msg.Frames[1])), msg.Frames[2])
	}
}

// handle applies one published batch, first repairing a gap before it.
func (s *Subscriber) handle(ctx context.Context, seq int64, payload []byte) {
	if seq <= s.last {
		return // a duplicate, or one a replay already applied
	}
	if seq != s.last+1 {
		s.mu.Lock()
		s.gaps++
		s.mu.Unlock()
		from := s.last + 1
		if !s.replay(ctx, from, seq) {
			s.Logger.Warn("KV events lost; prefix term back to the guess for the worker", "worker", s.Worker, "from_seq", from, "to_seq", seq-1)
			s.Index.Desync(s.Worker, from)
		}
	}
	s.apply(seq, payload)
}

func (s *Subscriber) apply(seq int64, payload []byte) {
	b, err := Decode(payload)
	if err != nil {
		s.Logger.Warn("KV events: bad batch", "worker", s.Worker, "seq", seq, "err", err)
		s.Index.Desync(s.Worker, seq)
		s.last = seq
		return
	}
	b.Seq = seq
	s.Index.Apply(s.Worker, b)
	s.last = seq
}

// replay asks the replay socket for the batches from..until-1 and applies
// them; it reports whether all of them came.
func (s *Subscriber) replay(ctx context.Context, from, until int64) bool {
	if s.Replay == "" {
		return false
	}
	timeout := s.ReplayTimeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	d := zmq4.NewDealer(rctx, zmq4.WithDialerMaxRetries(3))
	defer d.Close()
	if err := d.Dial(s.Replay); err != nil {
		s.Logger.Warn("KV events: dial replay", "worker", s.Worker, "err", err)
		return false
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], uint64(from))
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return false
	}
	for {
		msg, err := recvBefore(rctx, d)
		if err != nil {
			s.Logger.Warn("KV events: replay", "worker", s.Worker, "err", err)
			return false
		}
		fr := msg.Frames
		if len(fr) > 0 && len(fr[0]) == 0 {
			fr = fr[1:] // the empty delimiter the ROUTER sends back
		}
		if len(fr) != 2 || len(fr[0]) != 8 {
			return false
		}
		seq := int64(binary.BigEndian.Uint64(fr[0]))
		if seq < 0 { // end of the replay
			ok := s.last >= until-1
			if ok {
				s.mu.Lock()
				s.replays++
				s.mu.Unlock()
			}
			return ok
		}
		if seq != s.last+1 {
			if seq <= s.last {
				continue
			}
			return false // the buffer no longer holds what was missed
		}
		if seq < until {
			s.apply(seq, fr[1])
		}
	}
}

// recvBefore is Recv bounded by ctx: the socket is closed when ctx ends.
func recvBefore(ctx context.Context, sck zmq4.Socket) (zmq4.Msg, error) {
	type res struct {
		m   zmq4.Msg
		err error
	}
	ch := make(chan res, 1)
	go func() { m, err := sck.Recv(); ch <- res{m, err} }()
	select {
	case r := <-ch:
		return r.m, r.err
	case <-ctx.Done():
		sck.Close()
		return zmq4.Msg{}, ctx.Err()
	}
}

// Publisher is vLLM's ZmqEventPublisher for the simulators: a PUB socket
// sending (topic, seq, payload) and a ROUTER socket replaying its buffer.
type Publisher struct {
	pub, router zmq4.Socket
	topic       []byte

	mu     sync.Mutex
	seq    int64
	buffer []buffered // the last bufferSteps batches
	drop   int        // batches to keep from the PUB socket (tests)
	done   chan struct{}
}

type buffered struct {
	seq     int64
	payload []byte
}

const bufferSteps = 10_000

// NewPublisher listens on two loopback ports (addr "127.0.0.1:0" picks
// free ones) and serves replays until ctx ends.
func NewPublisher(ctx context.Context, addr, replayAddr string) (*Publisher, error) {
	p := &Publisher{pub: zmq4.NewPub(ctx), router: zmq4.NewRouter(ctx), done: make(chan struct{})}
	if err := p.pub.Listen("tcp://" + addr); err != nil {
		return nil, fmt.Errorf("kvevents: listen %s: %w", addr, err)
	}
	if err := p.router.Listen("tcp://" + replayAddr); err != nil {
		p.pub.Close()
		return nil, fmt.Errorf("kvevents: listen %s: %w", replayAddr, err)
	}
	go p.serveReplays()
	return p, nil
}

// Endpoints are the PUB and replay endpoints, tcp://host:port.
func (p *Publisher) Endpoints() (string, string) {
	return "tcp://" + p.pub.Addr().(*net.TCPAddr).String(), "tcp://" + p.router.Addr().(*net.TCPAddr).String()
}

// DropNext makes the next n batches go to the replay buffer only, as a
// PUB socket drops what a slow subscriber cannot take (tests).
func (p *Publisher) DropNext(n int) {
	p.mu.Lock()
	p.drop += n
	p.mu.Unlock()
}

// Publish sends events as the next batch and returns its seq.
func (p *Publisher) Publish(ts float64, events []Event) (int64, error) {
	payload, err := Encode(Batch{TS: ts, Events: events})
	if err != nil {
		return 0, err
	}
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.buffer = append(p.buffer, buffered{seq, payload})
	if len(p.buffer) > bufferSteps {
		p.buffer = p.buffer[len(p.buffer)-bufferSteps:]
	}
	drop := p.drop > 0
	if drop {
		p.drop--
	}
	p.mu.Unlock()
	if drop {
		return seq, nil
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], uint64(seq))
	return seq, p.pub.Send(zmq4.NewMsgFrom(p.topic, sb[:], payload))
}

// serveReplays answers (identity, "", start seq) with every buffered
// batch from start, then (-1, "").
func (p *Publisher) serveReplays() {
	defer close(p.done)
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id := msg.Frames[0]
		start := int64(binary.BigEndian.Uint64(msg.Frames[2]))
		p.mu.Lock()
		buf := append([]buffered(nil), p.buffer...)
		p.mu.Unlock()
		for _, b := range buf {
			if b.seq >= start {
				var sb [8]byte
				binary.BigEndian.PutUint64(sb[:], uint64(b.seq))
				if p.router.Send(zmq4.NewMsgFrom(id, []byte{}, sb[:], b.payload)) != nil {
					break
				}
			}
		}
		end := make([]byte, 8)
		binary.BigEndian.PutUint64(end, ^uint64(0)) // -1
		p.router.Send(zmq4.NewMsgFrom(id, []byte{}, end, []byte{}))
	}
}

// Close stops both sockets. One goroutine outlives it: zmq4 v0.17.0's
// PUB socket never stops its writer (pubMWriter.run), as its socket's
// Close does not close it; only simulators and tests publish.
func (p *Publisher) Close() error {
	err := errors.Join(p.pub.Close(), p.router.Close())
	<-p.done
	return err
}
