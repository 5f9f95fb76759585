package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Backoff between dials (see Connections and restarts in the package
// doc): minBackoff, doubled after each failure up to maxBackoff. A
// connection that delivered a batch starts the backoff over.
const (
	minBackoff = time.Second
	maxBackoff = 30 * time.Second
	// dialTimeout bounds one TCP connect to a host that does not answer.
	dialTimeout = 10 * time.Second
)

// errReconnect ends a connection that Reconnect asked to replace.
var errReconnect = errors.New("reconnect asked for")

// Subscriber follows one worker's KV-event publisher into an Index. Each
// connection starts the worker's index over: while none was open the
// publisher may have restarted, and its seq alone cannot tell a new
// process from the old one (see Connections and restarts in the package
// doc).
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

	// sleep waits d between dials (tests); nil waits on a timer.
	sleep func(ctx context.Context, d time.Duration) error

	once  sync.Once
	again chan struct{} // Reconnect's request, one pending at most

	last int64 // the last seq applied; -1 before any (Run's goroutine only)

	mu      sync.Mutex
	st      Status
	replays int
	gaps    int
}

// Status is a subscriber's connection to its publisher.
type Status struct {
	// Connected is true while a connection is open; false while dialing
	// or waiting to dial again.
	Connected bool
	// Connects counts the connections made.
	Connects int
	// LastError is the latest failure — a dial, a lost connection, a
	// replay — and LastErrorAt when it happened; empty before any.
	LastError   string
	LastErrorAt time.Time
}

// Counts returns how many gaps the subscriber saw and how many replays
// repaired one.
func (s *Subscriber) Counts() (gaps, replays int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gaps, s.replays
}

// Status returns the subscriber's connection state.
func (s *Subscriber) Status() Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.st
}

func (s *Subscriber) init() {
	s.once.Do(func() { s.again = make(chan struct{}, 1) })
}

// Reconnect makes Run close its connection, if one is open, and dial
// again at once, starting the worker's index over: the worker restarted
// (its health says so), and a connection to a process gone without a
// reset would never say so itself.
func (s *Subscriber) Reconnect() {
	s.init()
	select {
	case s.again <- struct{}{}:
	default:
	}
}

// Run subscribes and applies batches until ctx ends, and returns ctx's
// error. A failed dial or a lost connection is retried with backoff (see
// minBackoff), for as long as ctx lasts.
func (s *Subscriber) Run(ctx context.Context) error {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	s.init()
	wait := minBackoff
	for {
		received, err := s.connection(ctx)
		if ctx.Err() != nil {
			s.setConnected(false)
			return ctx.Err()
		}
		if received {
			wait = minBackoff
		}
		if errors.Is(err, errReconnect) {
			s.setConnected(false)
			s.Logger.Info("KV events: connecting again, the worker restarted", "worker", s.Worker, "endpoint", s.Endpoint)
			continue
		}
		s.fail(err, "KV events: no connection to the publisher; dialing again", "retry_in", wait)
		if s.pause(ctx, wait) != nil {
			s.setConnected(false)
			return ctx.Err()
		}
		wait = min(2*wait, maxBackoff)
	}
}

// pause waits d, or less when Reconnect asks for a dial now.
func (s *Subscriber) pause(ctx context.Context, d time.Duration) error {
	if s.sleep != nil {
		return s.sleep(ctx, d)
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.again:
	case <-ctx.Done():
		return ctx.Err()
	}
	return nil
}

// connection dials the publisher and applies its batches until the
// connection fails, ctx ends or Reconnect asks for another; received
// says whether a batch came.
func (s *Subscriber) connection(ctx context.Context) (received bool, err error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// zmq4 neither retries nor reconnects here: Run does, with backoff,
	// and starts the index over on each connection.
	sub := zmq4.NewSub(cctx, zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(dialTimeout))
	defer sub.Close()
	if err := sub.Dial(s.Endpoint); err != nil {
		return false, fmt.Errorf("dial %s: %w", s.Endpoint, err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
		return false, err
	}
	select { // this connection is the one a pending Reconnect asked for
	case <-s.again:
	default:
	}
	s.startOver()
	s.mu.Lock()
	s.st.Connected = true
	s.st.Connects++
	s.mu.Unlock()
	s.Logger.Info("KV events: connected; the worker's index starts over", "worker", s.Worker, "endpoint", s.Endpoint)

	asked, watched := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(watched)
		select {
		case <-s.again:
			close(asked)
			cancel()
		case <-cctx.Done():
		}
	}()
	defer func() { cancel(); <-watched }()
	for {
		msg, err := sub.Recv()
		if err != nil {
			select {
			case <-asked:
				return received, errReconnect
			default:
			}
			if ctx.Err() != nil {
				return received, ctx.Err()
			}
			// zmq4 delivers a connection's read error once, then
			// stops reading it: the connection is over.
			return received, fmt.Errorf("connection to %s lost: %w", s.Endpoint, err)
		}
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
			s.Logger.Warn("KV events: message is not (topic, seq, payload)", "worker", s.Worker, "frames", len(msg.Frames))
			continue
		}
		received = true
		s.handle(cctx, int64(binary.BigEndian.Uint64(msg.Frames[1])), msg.Frames[2])
	}
}

// startOver empties the worker's index and forgets the last seq.
func (s *Subscriber) startOver() {
	s.Index.Reset(s.Worker)
	s.last = -1
}

func (s *Subscriber) setConnected(c bool) {
	s.mu.Lock()
	s.st.Connected = c
	s.mu.Unlock()
}

// fail notes err as the latest failure and logs msg: a warning when the
// failure is new, a debug line when it repeats the previous one.
func (s *Subscriber) fail(err error, msg string, attrs ...any) {
	s.mu.Lock()
	repeat := s.st.LastError == err.Error() && !s.st.Connected
	s.st.Connected = false
	s.st.LastError, s.st.LastErrorAt = err.Error(), time.Now()
	s.mu.Unlock()
	level := slog.LevelWarn
	if repeat {
		level = slog.LevelDebug
	}
	s.Logger.Log(context.Background(), level, msg, append([]any{"worker", s.Worker, "err", err}, attrs...)...)
}

// noteErr records a failure that leaves the connection open (a replay).
func (s *Subscriber) noteErr(err error) {
	s.mu.Lock()
	s.st.LastError, s.st.LastErrorAt = err.Error(), time.Now()
	s.mu.Unlock()
}

// handle applies one published batch, first repairing a gap before it.
func (s *Subscriber) handle(ctx context.Context, seq int64, payload []byte) {
	if seq <= s.last {
		// PUB delivers in order and a replay applies only what precedes
		// the batch that asked for it, so this is no duplicate: vLLM
		// counts from 0 in each process, and the publisher restarted.
		s.Logger.Warn("KV events: seq went back, the publisher restarted; the worker's index starts over",
			"worker", s.Worker, "seq", seq, "last_seq", s.last)
		s.startOver()
	}
	if seq != s.last+1 {
		s.mu.Lock()
		s.gaps++
		s.mu.Unlock()
		from := s.last + 1
		if err := s.replay(ctx, from, seq); err != nil {
			err = fmt.Errorf("replay of seq %d-%d: %w", from, seq-1, err)
			s.noteErr(err)
			s.Logger.Warn("KV events lost; prefix term back to the guess for the worker", "worker", s.Worker, "from_seq", from, "to_seq", seq-1, "err", err)
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
// them; it returns why not all of them came.
func (s *Subscriber) replay(ctx context.Context, from, until int64) error {
	if s.Replay == "" {
		return errors.New("no replay endpoint configured")
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
		return fmt.Errorf("dial %s: %w", s.Replay, err)
	}
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, seqFrame(from))); err != nil {
		return fmt.Errorf("send the request to %s: %w", s.Replay, err)
	}
	for {
		msg, err := recvBefore(rctx, d)
		if err != nil {
			return fmt.Errorf("receive from %s: %w", s.Replay, err)
		}
		fr := msg.Frames
		if len(fr) > 0 && len(fr[0]) == 0 {
			fr = fr[1:] // the empty delimiter the ROUTER sends back
		}
		if len(fr) != 2 || len(fr[0]) != 8 {
			return fmt.Errorf("%s answered %d frames, not (seq, payload)", s.Replay, len(fr))
		}
		seq := int64(binary.BigEndian.Uint64(fr[0]))
		if seq < 0 { // end of the replay
			if s.last < until-1 {
				return fmt.Errorf("the buffer ended at seq %d", s.last)
			}
			s.mu.Lock()
			s.replays++
			s.mu.Unlock()
			return nil
		}
		if seq != s.last+1 {
			if seq <= s.last {
				continue
			}
			return fmt.Errorf("the buffer starts at seq %d, after the first missed", seq)
		}
		if seq < until {
			s.apply(seq, fr[1])
		}
	}
}

// seqFrame is a batch's seq as the wire carries it: 8 bytes big-endian.
func seqFrame(seq int64) []byte { return binary.BigEndian.AppendUint64(nil, uint64(seq)) }

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
	payload, err := encode(Batch{TS: ts, Events: events})
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
	return seq, p.pub.Send(zmq4.NewMsgFrom(p.topic, seqFrame(seq), payload))
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
		buf := slices.Clone(p.buffer)
		p.mu.Unlock()
		for _, b := range buf {
			if b.seq >= start {
				if p.router.Send(zmq4.NewMsgFrom(id, []byte{}, seqFrame(b.seq), b.payload)) != nil {
					break
				}
			}
		}
		p.router.Send(zmq4.NewMsgFrom(id, []byte{}, seqFrame(-1), []byte{})) // the end

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
