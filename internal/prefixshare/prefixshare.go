// Package prefixshare shares the router's prefix index (package prefix)
// between the replicas of one fleet through a Redis stream, so that a
// conversation whose earlier turn replica A sent to worker W is expected on
// W when its next turn reaches replica B.
//
// # Design
//
// Each replica keeps its own *prefix.Index, and picks read only it:
// MatchSources never leaves the process. Record updates the local index and
// hands a copy of the record to a bounded queue without waiting (a full
// queue drops the record and counts it). A publisher goroutine appends what
// is queued to one stream, prefix + "prefix:records", with XADD MAXLEN ~ N,
// several records per round trip. A follower goroutine reads the stream with
// XREAD BLOCK from the last entry it saw and applies the other replicas'
// records to the local index with prefix.Index.Apply, timed by the entry's
// ID. Each entry names its replica and when its Index was made: the follower
// skips its own Index's entries, not those a replica of the same name
// recorded before it restarted.
//
// A stream rather than the alternatives:
//
//   - Pub/sub loses every message sent while a subscriber is disconnected
//     and keeps nothing for a replica that starts later; the stream keeps
//     the recent past, so a follower that reconnects resumes from the last
//     entry it applied, and a new replica warms up by reading the entries
//     of the last Window.
//   - A sorted set per model and worker (block hash by time) would hold the
//     index itself, bounded exactly like the local one, but a replica would
//     have to poll every worker's set to see changes: a round trip per
//     worker per poll, and a propagation delay of the poll period. The
//     stream pushes: a blocked XREAD returns as soon as an entry is added.
//   - Entries of one stream have one order (Redis assigns increasing IDs),
//     so every replica applies the others' records in the order Redis
//     received them; since Apply keeps the later time of a block, the order
//     matters little anyway.
//
// # Bounds
//
// In Redis: the stream keeps about MaxLen entries (XADD's approximate
// trim removes whole nodes of entries, stream-node-max-entries, 100 by
// default, so it may hold up to that many more), each carrying at most
// MaxHashes hashes (8 bytes each), the first of the prompt, and the key
// expires Window after the last publish, so a fleet whose replicas all
// stopped leaves nothing behind. Entries older than the Window are never
// applied. A prompt longer than MaxHashes blocks (256, 32k tokens, by
// default) is known to the other replicas by its first MaxHashes blocks
// only: a partial match, which still tells its worker from the others. In
// each process: the queue holds at most Queue records of at most MaxHashes
// hashes (4,096 × 2 KiB = 8 MiB by default), and applied records go into
// the local index, whose per-model, per-worker capacity bounds them as it
// bounds local ones.
//
// # What is not shared
//
// Forget, SetCapacity and Correct act on the local index only. A worker
// removed from one replica is forgotten there; the others forget it when
// they remove it too, and until then what they learnt of it stays, within
// the worker's capacity, till newer blocks push it out. Each replica sizes
// its copy from its own scrapes of the workers' KV caches, which agree when
// the replicas serve one fleet, and corrects it from the answers it relays.
// An entry naming a worker this replica does not know is applied all the
// same, bounded like any other (model, worker) of the index: the replicas of
// one fleet name the same workers.
//
// # Propagation delay
//
// A record reaches the other replicas after the publisher's XADD and the
// follower's blocked XREAD returning: about two round trips to Redis plus
// the time a record waits behind the batch being sent (BenchmarkPropagation
// measures it). While Redis is down nothing
// propagates; afterwards the follower catches up within MaxBackoff. The
// follower reports, per applied entry, the time from its XADD (on Redis's
// clock, corrected by an offset measured with TIME at each connection) to
// its application (Lag); entry IDs count milliseconds, so Lag is up to a
// millisecond high.
//
// # Redis down, slow, back
//
// Neither MatchSources nor Record calls Redis or waits on anything Redis
// does. A publish that fails drops its batch (counted) and the publisher
// backs off (up to MaxBackoff, a second by default) while the queue fills
// and drops further records; the follower reconnects with the same backoff
// from the last entry it applied, so records published while it was away are
// applied late rather than never, as far as the stream still holds them. If
// Redis came back empty, the stream starts again with IDs from its clock,
// later than the last seen; should that clock be behind the last entry seen
// (a failover to a host whose clock lags), the follower starts again from
// the Window, applying some entries twice, which Apply makes harmless.
// Records dropped during an outage are lost to the other replicas: the index
// is a hint, the next turn of the conversation records its prefix again.
//
// # Concurrency Model
//
// An Index is safe for concurrent use. MatchSources, Record and Forget run
// on the caller's goroutine (the scheduler calls them under its lock) and touch
// only the local *prefix.Index, which has its own mutex, and the queue,
// with a non-blocking send. Run owns two goroutines: the publisher, the
// queue's only reader, and the follower, the only writer of the remote
// records into the local index (through Apply, under the index's mutex,
// one record at a time, so a pick waits at most for one record's update).
// The follower reads on its own connection, which Run closes when its
// context ends, so a blocked XREAD never delays shutdown. Counters are
// atomics; Changed's channel is swapped under a small mutex.
package prefixshare

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-router/sluice/internal/prefix"
)

// Defaults for Config fields left zero.
const (
	// DefaultMaxLen bounds the stream: at 1,000 requests a second across
	// the fleet it holds the last 16 s.
	DefaultMaxLen = 16384
	// DefaultQueue bounds the records waiting to be published.
	DefaultQueue = 4096
	// DefaultMaxHashes bounds the hashes of one entry: the router's
	// default index capacity, 256 blocks or about 32k tokens.
	DefaultMaxHashes = prefix.DefaultCapacity
	// DefaultBlock is how long one XREAD waits for new entries before it
	// asks again.
	DefaultBlock = 5 * time.Second
	// DefaultMaxBackoff bounds the wait between attempts while Redis is
	// unreachable: sharing resumes within about this long of Redis
	// answering again, as the shared ledger's renewals (every second by
	// default) do.
	DefaultMaxBackoff = time.Second
	// DefaultWindow is how far back a replica that starts reads the
	// stream: the prefixes the others sent in the last minutes, whose
	// workers are likely to hold them still; the local index's capacity
	// then keeps those the workers can hold.
	DefaultWindow = 5 * time.Minute
)

// maxBatch is the most records one publish round trip carries, and the
// most entries one XREAD returns.
const maxBatch = 256

// Config configures an Index.
type Config struct {
	// Redis are the options of the Redis connections (redisconn.Parse
	// makes them), not yet used by a client: Run opens one client to
	// publish and one to follow the stream, and closes both when it
	// returns.
	Redis *redis.Options
	// Prefix starts the stream's key (e.g. "sluice:").
	Prefix string
	// Replica names this router, unique among the replicas. Entries
	// carry it with the time this Index was made, and the follower skips
	// those of this Index only: a replica restarted under the same name
	// warms up from what it recorded before.
	Replica string
	// Local is the replica's index: MatchSources reads it, Record and the other
	// replicas' records update it.
	Local *prefix.Index
	// Window is how far back a starting replica reads the stream, and
	// how long the stream outlives its last record; DefaultWindow when
	// zero.
	Window time.Duration
	// MaxLen bounds the stream's entries; DefaultMaxLen when zero.
	MaxLen int64
	// Queue bounds the records waiting to be published; DefaultQueue
	// when zero.
	Queue int
	// MaxHashes bounds the hashes one entry carries, the first of the
	// prompt; DefaultMaxHashes when zero.
	MaxHashes int
	// Block is how long one XREAD waits; DefaultBlock when zero.
	Block time.Duration
	// MaxBackoff bounds the wait between attempts while Redis fails;
	// DefaultMaxBackoff when zero.
	MaxBackoff time.Duration
	// Logger; discards when nil.
	Logger *slog.Logger
}

// Index is a prefix index shared with the other replicas: a
// scheduler.PrefixIndex whose MatchSources and Record are the local index's,
// with Record also published (see the package doc).
type Index struct {
	cfg   Config
	self  string // this Index's tag in its entries: replica and start
	local *prefix.Index
	key   string
	queue chan record

	published, applied, dropped, failed atomic.Uint64
	lag                                 atomic.Int64 // ns, of the last live entry applied
	up                                  atomic.Bool  // the last call into Redis succeeded
	downLogged                          atomic.Bool

	mu      sync.Mutex
	changed chan struct{}
}

// record is one Record on its way to the stream.
type record struct {
	model, worker string
	hashes        []byte // little-endian uint64s
}

// New returns an Index; Run starts the sharing.
func New(cfg Config) (*Index, error) {
	switch {
	case cfg.Redis == nil:
		return nil, errors.New("prefixshare: no Redis options")
	case cfg.Local == nil:
		return nil, errors.New("prefixshare: no local index")
	case cfg.Replica == "":
		return nil, errors.New("prefixshare: no replica name")
	}
	if cfg.MaxLen <= 0 {
		cfg.MaxLen = DefaultMaxLen
	}
	if cfg.Queue <= 0 {
		cfg.Queue = DefaultQueue
	}
	if cfg.MaxHashes <= 0 {
		cfg.MaxHashes = DefaultMaxHashes
	}
	if cfg.Block <= 0 {
		cfg.Block = DefaultBlock
	}
	if cfg.MaxBackoff <= 0 {
		cfg.MaxBackoff = DefaultMaxBackoff
	}
	if cfg.Window <= 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Index{
		cfg: cfg, local: cfg.Local, key: cfg.Prefix + "prefix:records",
		self:  cfg.Replica + "@" + strconv.FormatInt(time.Now().UnixNano(), 36),
		queue: make(chan record, cfg.Queue), changed: make(chan struct{}),
	}, nil
}

// Key is the stream's key.
func (x *Index) Key() string { return x.key }

// MatchSources is the local index's MatchSources: remote tells whether a
// matched block was learnt from another replica.
func (x *Index) MatchSources(model string, hashes []uint64, workers []string, frac []float64, remote []bool) {
	x.local.MatchSources(model, hashes, workers, frac, remote)
}

// Record records in the local index and queues the record for the other
// replicas without waiting: when the queue is full the record is dropped
// (counted in Stats.Dropped).
func (x *Index) Record(model string, hashes []uint64, worker string) {
	if len(hashes) == 0 {
		return
	}
	x.local.Record(model, hashes, worker)
	hashes = hashes[:min(len(hashes), x.cfg.MaxHashes)]
	b := make([]byte, 8*len(hashes))
	for i, h := range hashes {
		binary.LittleEndian.PutUint64(b[8*i:], h)
	}
	select {
	case x.queue <- record{model: model, worker: worker, hashes: b}:
	default:
		x.dropped.Add(1)
	}
}

// SetCapacity bounds what the local index remembers of worker to a KV
// cache of tokens tokens (see prefix.Index.SetCapacity), so a shared index
// is sized from the worker's report as a local one is
// (scheduler.PrefixCapacity). Each replica sizes its own copy from its
// own scrapes; nothing is published.
func (x *Index) SetCapacity(worker string, tokens int) { x.local.SetCapacity(worker, tokens) }

// Correct corrects the local index from what worker reported finding
// cached (see prefix.Index.Correct; scheduler.PrefixCorrector). Each
// replica learns from the answers it relays; nothing is published: the
// other replicas learn the same of the worker from theirs.
func (x *Index) Correct(model, worker string, hashes []uint64, expected, found int) {
	x.local.Correct(model, worker, hashes, expected, found)
}

// Forget drops what the local index remembers of worker.
func (x *Index) Forget(worker string) { x.local.Forget(worker) }

// Stats are an Index's counters.
type Stats struct {
	// Published counts records appended to the stream.
	Published uint64
	// Applied counts other replicas' records applied to the local index.
	Applied uint64
	// Dropped counts records never published: the queue was full.
	Dropped uint64
	// Failed counts records whose publish failed (Redis down or slow).
	Failed uint64
	// Lag is the time from the last applied live entry's XADD to its
	// application here (entries read while warming up or catching up
	// after an outage do not count).
	Lag time.Duration
	// Up is whether the last call into Redis succeeded.
	Up bool
}

// Stats returns the counters.
func (x *Index) Stats() Stats {
	return Stats{
		Published: x.published.Load(), Applied: x.applied.Load(),
		Dropped: x.dropped.Load(), Failed: x.failed.Load(),
		Lag: time.Duration(x.lag.Load()), Up: x.up.Load(),
	}
}

// Changed returns a channel closed at the next change of Stats, so a
// caller can wait for a condition on them without polling: take the
// channel, check the condition, then wait on the channel.
func (x *Index) Changed() <-chan struct{} {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.changed
}

func (x *Index) notify() {
	x.mu.Lock()
	close(x.changed)
	x.changed = make(chan struct{})
	x.mu.Unlock()
}

// Run publishes this replica's records and applies the others' until ctx
// ends. Call it once.
func (x *Index) Run(ctx context.Context) {
	po, fo := *x.cfg.Redis, *x.cfg.Redis // copies, before NewClient fills them in
	po.PoolSize, fo.PoolSize = 2, 1
	pub, sub := redis.NewClient(&po), redis.NewClient(&fo)
	var wg sync.WaitGroup
	wg.Go(func() { x.publish(ctx, pub) })
	wg.Go(func() { x.follow(ctx, sub) })
	<-ctx.Done()
	sub.Close() // ends a blocked XREAD now
	pub.Close()
	wg.Wait()
}

// setUp records the outcome of a call into Redis, logging the change to
// down once and the change back.
func (x *Index) setUp(err error) {
	if err == nil {
		x.up.Store(true)
		if x.downLogged.CompareAndSwap(true, false) {
			x.cfg.Logger.Info("prefix index sharing: Redis answers again", "stream", x.key)
		}
		return
	}
	x.up.Store(false)
	if x.downLogged.CompareAndSwap(false, true) {
		x.cfg.Logger.Warn("prefix index sharing: Redis unavailable; picks use this replica's index alone", "stream", x.key, "err", err)
	}
}

// backoff waits d (doubled for the next time, up to MaxBackoff) or until
// ctx ends; it reports whether ctx is still alive.
func (x *Index) backoff(ctx context.Context, d *time.Duration) bool {
	t := time.NewTimer(*d)
	defer t.Stop()
	*d = min(2**d, x.cfg.MaxBackoff)
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

const minBackoff = 50 * time.Millisecond

// publish appends queued records to the stream, a batch per round trip.
func (x *Index) publish(ctx context.Context, pub *redis.Client) {
	batch := make([]record, 0, maxBatch)
	wait := minBackoff
	for {
		batch = batch[:0]
		select {
		case <-ctx.Done():
			return
		case r := <-x.queue:
			batch = append(batch, r)
		}
	more:
		for len(batch) < maxBatch {
			select {
			case r := <-x.queue:
				batch = append(batch, r)
			default:
				break more
			}
		}
		_, err := pub.Pipelined(ctx, func(p redis.Pipeliner) error {
			for _, r := range batch {
				p.XAdd(ctx, &redis.XAddArgs{
					Stream: x.key, MaxLen: x.cfg.MaxLen, Approx: true,
					Values: []any{"r", x.self, "m", r.model, "w", r.worker, "h", r.hashes},
				})
			}
			p.PExpire(ctx, x.key, x.cfg.Window)
			return nil
		})
		if ctx.Err() != nil {
			return
		}
		x.setUp(err)
		if err != nil {
			x.failed.Add(uint64(len(batch)))
			x.notify()
			if !x.backoff(ctx, &wait) {
				return
			}
			continue
		}
		wait = minBackoff
		x.published.Add(uint64(len(batch)))
		x.notify()
	}
}

// follow applies the other replicas' entries, reconnecting from the last
// entry seen after a failure.
func (x *Index) follow(ctx context.Context, sub *redis.Client) {
	var last streamID // zero: start from the Window
	wait := minBackoff
	for ctx.Err() == nil {
		err := x.followOnce(ctx, sub, &last, func() { wait = minBackoff })
		if ctx.Err() != nil {
			return
		}
		x.setUp(err)
		x.notify()
		if !x.backoff(ctx, &wait) {
			return
		}
	}
}

// followOnce reads the stream on one connection until a call fails. It
// measures the clock offset to Redis, chooses where to start, then applies
// entries as XREAD returns them; ok is called after each successful read.
func (x *Index) followOnce(ctx context.Context, sub *redis.Client, last *streamID, ok func()) error {
	before := time.Now()
	server, err := sub.Time(ctx).Result()
	if err != nil {
		return fmt.Errorf("TIME: %w", err)
	}
	after := time.Now()
	// offset turns Redis's clock into this process's: local = server + offset.
	offset := before.Add(after.Sub(before) / 2).Sub(server)
	window := streamID{ms: uint64(server.Add(-x.cfg.Window).UnixMilli())}
	if last.less(window) || last.ms > uint64(server.UnixMilli()) {
		// First start, an outage longer than the Window, or a Redis whose
		// clock is behind the entries seen: read the whole window.
		*last = window
	}
	// Entries from the next millisecond on were added while following
	// (those of this millisecond may be older than TIME's answer).
	live := streamID{ms: uint64(server.UnixMilli()) + 1}
	x.setUp(nil)
	for {
		res, err := sub.XRead(ctx, &redis.XReadArgs{
			Streams: []string{x.key, last.String()}, Count: maxBatch, Block: x.cfg.Block,
		}).Result()
		if errors.Is(err, redis.Nil) {
			ok()
			continue // nothing new within Block
		}
		if err != nil {
			return fmt.Errorf("XREAD: %w", err)
		}
		ok()
		var n uint64
		for _, s := range res {
			for _, m := range s.Messages {
				id, err := parseID(m.ID)
				if err != nil {
					continue // not an ID Redis makes; skip the entry
				}
				*last = id
				if x.apply(m.Values, id, offset, live) {
					n++
				}
			}
		}
		if n > 0 {
			x.applied.Add(n)
			x.notify()
		}
	}
}

// apply applies one entry unless it is this replica's own or malformed.
func (x *Index) apply(v map[string]any, id streamID, offset time.Duration, live streamID) bool {
	replica, _ := v["r"].(string)
	model, _ := v["m"].(string)
	worker, _ := v["w"].(string)
	raw, _ := v["h"].(string)
	if replica == x.self || model == "" || worker == "" || len(raw) == 0 || len(raw)%8 != 0 {
		return false
	}
	hashes := make([]uint64, min(len(raw)/8, x.cfg.MaxHashes))
	for i := range hashes {
		hashes[i] = binary.LittleEndian.Uint64([]byte(raw[8*i : 8*i+8]))
	}
	at := time.UnixMilli(int64(id.ms)).Add(offset)
	x.local.Apply(model, hashes, worker, at)
	if !id.less(live) {
		x.lag.Store(int64(max(0, time.Since(at))))
	}
	return true
}

// streamID is a stream entry ID: milliseconds of Redis's clock and a
// sequence number within them.
type streamID struct{ ms, seq uint64 }

func (a streamID) less(b streamID) bool { return a.ms < b.ms || a.ms == b.ms && a.seq < b.seq }

func (a streamID) String() string {
	return strconv.FormatUint(a.ms, 10) + "-" + strconv.FormatUint(a.seq, 10)
}

func parseID(s string) (streamID, error) {
	ms, seq, ok := strings.Cut(s, "-")
	if !ok {
		return streamID{}, fmt.Errorf("stream ID %q: no '-'", s)
	}
	a, err := strconv.ParseUint(ms, 10, 64)
	if err != nil {
		return streamID{}, fmt.Errorf("stream ID %q: %w", s, err)
	}
	b, err := strconv.ParseUint(seq, 10, 64)
	if err != nil {
		return streamID{}, fmt.Errorf("stream ID %q: %w", s, err)
	}
	return streamID{a, b}, nil
}
