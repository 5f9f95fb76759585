// Package shared lets several Sluice replicas in front of one fleet behave
// as one scheduler: they reserve worker capacity in one ledger in Redis, so
// the fleet's max_concurrency holds across replicas and four requests
// arriving at once at three replicas land one per idle worker, as they do
// at one.
//
// # Picking and reserving in one step
//
// A replica scores its eligible workers itself — telemetry and measured
// averages are local — but leaves out the active-requests term, which only
// the ledger knows across replicas. Reserve sends, per candidate, that
// partial score, the active-requests weight and the worker's limit to a Lua
// script. The script reads each worker's shared in-flight count, adds
// weight × active, keeps the workers under their limit, picks the lowest
// total (ties: the least recently picked by a shared pick sequence, then
// the order given — no randomness), records a lease on the winner and
// returns it. Redis runs a script atomically: no other command runs between
// the script's reads and its writes, so two replicas can never both see the
// same free slot, exactly as the single scheduler's one mutex guarantees
// locally.
//
// # Leases, and replicas that die
//
// Every reservation is a lease in a ZSET scored by its expiry (server
// time, from TIME, so replicas' clocks need not agree), and each worker's
// in-flight count is kept next to it in a hash that the same scripts
// change in the same atomic step — one more for a lease added, one less
// for a lease released or expired — so a count always equals its worker's
// live leases and a pick reads all counts in one command. Every script first
// reaps the expired leases, so a count never includes a dead replica's
// slots. A replica renews its leases every RenewEvery (by default 1s) for
// LeaseTTL (5s); Release removes one. A replica that is killed stops
// renewing, and its capacity comes back within LeaseTTL of its last
// renewal, without anyone noticing it died.
//
// # Freed slots, across replicas
//
// Each replica keeps its own admission queue. So that a freed slot goes to
// the replica whose request has waited longest, and a busy replica cannot
// starve the others by re-binding its own queue the instant its request
// ends, every request queued at a replica is on a shared waiting list for
// its model (a ZSET scored by enqueue time on the server's clock, with
// expiry renewed like a lease). The turn is the replica's with the oldest
// waiter: the pick script refuses ("not your turn") the other replicas'
// requests while it waits. Which of its requests that replica places is its
// own queue's choice — priorities and the cost order may let a cheaper one
// overtake its oldest, as in one router — so two replicas never each wait
// for the other. Release and leaving the waiting list (Unwait, or a pick
// that binds a waiter and so passes the turn to another replica) publish on
// a channel every replica subscribes to, so the one whose turn it is retries
// at once rather than at its next poll. A replica releases its shared slot
// before serving its own queue, so its own oldest request takes the slot at
// once, as in one router. Pub/sub is only the wake-up: a lost message costs
// latency (the renew tick retries too), never correctness, which lives in
// the script.
//
// # Redis failover, restart and outage
//
// If Redis restarts empty (or a replica fails over to a replica that had
// not seen the latest writes), the next renewal re-creates every lease and
// waiter a live replica holds, so the counts come back to what really
// runs; leases of a replica that died meanwhile are not re-created. While
// Redis is unreachable or slower than CallTimeout, Reserve fails at once
// with ErrDegraded without waiting on the network: the caller schedules on
// its local view with its share (limit / Replicas, at least 1) of each
// worker, and records those reservations with Adopt, so that they are
// published at the first renewal that reaches Redis again. No request
// waits on Redis being down.
//
// Every renewal that reaches Redis then reconciles: it removes any lease
// or waiter of this replica that the replica no longer holds, whatever
// path left it there (see Ledger.reconcile), so a stray entry holds a slot
// or another replica's turn for at most RenewEvery, not LeaseTTL. The
// cost is one more script per renewal, reading the lease set and the
// waiting lists of the models this replica has requests waiting for.
//
// # Learned limits and decision counters
//
// Adaptive concurrency needs no state of its own here. Each replica learns
// a worker's limit from the per-level decode rates in the stats store
// (stats.store, on the same Redis), into which every replica folds its
// streams' samples, so all of them read one curve. A stream is filed under
// the worker's in-flight count across replicas — this replica's own plus
// the others' as the latest pick (or "full" answer) of this Ledger
// reported them — not under its replica's share: a card running one
// stream per replica ran three, and its limit must be learned at three.
// The limit a replica sends with Reserve is then checked against the
// shared count, so between two stats flushes the replicas' limits may
// differ by a probe, but no pick takes a worker past the limit of the
// replica that makes it.
//
// The decision counters are not shared; they are named. The metrics that
// count decisions (sluice_requests_total by worker, status and reason,
// sluice_retries_total, the token counters) count what this replica
// decided, and Prometheus, which scrapes every replica, sums them into
// the fleet's: the same totals one router would show, without a Redis
// round trip per request for a counter, and without a gap while Redis is
// down. Of the counters that decide, the one that must be common is: the
// pick sequence that breaks ties between equal scores lives in the ledger
// (the script's seq and lastpick), so "least recently picked" means by any
// replica, and a record ranks the ledger's choice first and says so.
// Every decision record names the replica that made it (replica; its ID
// starts with the replica's name) and how old the shared state it used
// was (shared_state_age_ms, since Redis last answered; absent while it
// never has), and degraded marks a decision made on the local view.
//
// # Concurrency Model
//
// A Ledger is safe for concurrent use. A mutex guards the set of held leases
// and waiters and the lease numbers; a read-write lock orders releases,
// waits and unwaits against renewals, so that a renewal cannot re-create a
// lease just released nor take for stray a waiter just added. Run owns the
// renew loop and the subscription; the calls into Redis happen outside the
// mutex.
package shared

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Defaults for Config fields left zero.
const (
	DefaultLeaseTTL    = 5 * time.Second
	DefaultCallTimeout = 250 * time.Millisecond
)

// Errors from Reserve.
var (
	// ErrFull means no candidate has a free slot in the shared view.
	ErrFull = errors.New("shared: every candidate is at its limit")
	// ErrNotYourTurn means another replica holds the model's oldest
	// waiting request; the request stays queued until a wake-up.
	ErrNotYourTurn = errors.New("shared: an older request of another replica waits for this model")
	// ErrDegraded means Redis is unreachable or slow: the caller falls
	// back to its local view (see the package doc).
	ErrDegraded = errors.New("shared: shared state unavailable")
)

// Config configures a Ledger.
type Config struct {
	// Client is the Redis connection; the Ledger does not close it.
	Client *redis.Client
	// Prefix starts every key and the channel (e.g. "sluice:").
	Prefix string
	// Replica names this router; unique among the replicas.
	Replica string
	// LeaseTTL is how long a lease lives without renewal: the longest a
	// dead replica's capacity stays taken. DefaultLeaseTTL when zero.
	LeaseTTL time.Duration
	// RenewEvery is the renewal period; LeaseTTL/5 when zero.
	RenewEvery time.Duration
	// CallTimeout bounds each call into Redis from the request path;
	// slower counts as down. DefaultCallTimeout when zero.
	CallTimeout time.Duration
	// Replicas is how many replicas share the fleet: each takes
	// limit/Replicas of a worker while degraded. 1 when zero.
	Replicas int
	// Logger; discards when nil.
	Logger *slog.Logger
}

// Candidate is one eligible worker as the replica scored it.
type Candidate struct {
	// Worker names the worker.
	Worker string
	// Score is the replica's total without the active-requests term.
	Score float64
	// ActiveWeight multiplies the shared in-flight count in the total.
	ActiveWeight float64
	// Limit is the worker's max_concurrency across all replicas.
	Limit int
}

// Reservation is one held slot.
type Reservation struct {
	// Worker is the reserved worker.
	Worker string
	// Index is the worker's index among the candidates passed to Reserve.
	Index int
	// Lease identifies the slot in the ledger.
	Lease string
	// Active holds each candidate's shared in-flight count just before the
	// pick, in candidate order (nil from Adopt).
	Active []int
}

// Ledger is one replica's handle on the shared reservations.
type Ledger struct {
	cfg  Config
	rdb  *redis.Client
	log  *slog.Logger
	wake chan struct{}

	renewMu sync.RWMutex // Lock: a renewal in flight; RLock: a release
	mu      sync.Mutex
	seq     uint64            // the last lease number issued
	held    map[string]string // lease id -> worker ("" while its Reserve runs)
	waiters map[string]waiter // member -> its model and enqueue µs
	models  map[string]bool   // the models whose waiting lists reconcile clears (see reconcile)

	degraded atomic.Bool
	lastOK   atomic.Int64 // unix ns of the last successful round trip

	subscribed  chan struct{} // tests: closed once Run listens for wake-ups
	beforeRenew func()        // tests: runs between a renewal's snapshot and its script
}

type waiter struct {
	model string
	us    string
}

// New returns a Ledger; Run must be running for leases to outlive LeaseTTL.
func New(cfg Config) (*Ledger, error) {
	if cfg.Client == nil {
		return nil, errors.New("shared: no Redis client")
	}
	if cfg.Replica == "" || strings.ContainsAny(cfg.Replica, "|/ \t\n") {
		return nil, fmt.Errorf("shared: replica name %q must be non-empty, without spaces, '|' or '/'", cfg.Replica)
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = DefaultLeaseTTL
	}
	if cfg.RenewEvery <= 0 {
		cfg.RenewEvery = cfg.LeaseTTL / 5
	}
	if cfg.RenewEvery >= cfg.LeaseTTL {
		return nil, fmt.Errorf("shared: renew period %v is not shorter than the lease TTL %v", cfg.RenewEvery, cfg.LeaseTTL)
	}
	if cfg.CallTimeout <= 0 {
		cfg.CallTimeout = DefaultCallTimeout
	}
	if cfg.Replicas <= 0 {
		cfg.Replicas = 1
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Ledger{
		cfg: cfg, rdb: cfg.Client, log: log.With("replica", cfg.Replica),
		wake: make(chan struct{}, 1), held: map[string]string{}, waiters: map[string]waiter{},
		models: map[string]bool{},
	}, nil
}

// Replica is this replica's name.
func (l *Ledger) Replica() string { return l.cfg.Replica }

// Degraded reports whether the last call into Redis failed, so the replica
// schedules on its local view.
func (l *Ledger) Degraded() bool { return l.degraded.Load() }

// StateAge is how long ago Redis last answered; large while degraded.
func (l *Ledger) StateAge(now time.Time) time.Duration {
	ok := l.lastOK.Load()
	if ok == 0 {
		return 0
	}
	return now.Sub(time.Unix(0, ok))
}

// LocalLimit is this replica's share of a worker with the given limit
// while degraded: limit / Replicas, at least 1.
func (l *Ledger) LocalLimit(limit int) int { return max(1, limit/l.cfg.Replicas) }

// Wake receives a value when a slot may have freed on another replica or
// the oldest waiter changed (and on every renewal, as a backstop): the
// replica should retry the heads of its queues.
func (l *Ledger) Wake() <-chan struct{} { return l.wake }

func (l *Ledger) key(parts ...string) string {
	return l.cfg.Prefix + "shared:" + strings.Join(parts, ":")
}
func (l *Ledger) leasesKey() string       { return l.key("leases") }
func (l *Ledger) countsKey() string       { return l.key("inflight") }
func (l *Ledger) channel() string         { return l.key("wake") }
func (l *Ledger) member(id string) string { return l.cfg.Replica + "|" + id }

// Reserve picks the candidate with the lowest score plus ActiveWeight ×
// its shared in-flight count, among those under their limit, and reserves
// it, in one atomic step across replicas. waitID names the request on the
// waiting list (see Wait) when it queued; "" for a request that did not.
// It returns ErrFull (with the counts it read in Active), ErrNotYourTurn,
// or ErrDegraded without touching Redis while Redis is known to be down.
func (l *Ledger) Reserve(ctx context.Context, model, waitID string, cands []Candidate) (Reservation, error) {
	if len(cands) == 0 {
		return Reservation{}, ErrFull
	}
	if l.degraded.Load() {
		return Reservation{}, ErrDegraded
	}
	keys := []string{l.key("seq"), l.key("lastpick"), l.key("wait", model), l.key("waitexp", model), l.leasesKey(), l.countsKey()}
	me := ""
	if waitID != "" {
		me = l.member(waitID)
	}
	packed := packCandidates(make([]byte, 0, packedSize(cands)), cands)
	// Hold the lease as ours before the script creates it, so a renewal
	// running meanwhile keeps it; its number is taken under the same lock,
	// so a renewal's reconciliation sees every lease numbered up to the
	// last it saw issued either held here or given up.
	l.mu.Lock()
	lease := l.newLeaseLocked()
	l.held[lease] = ""
	l.mu.Unlock()
	res, err := l.run(ctx, pickScript, keys, lease, l.cfg.LeaseTTL.Milliseconds(), me, l.cfg.Replica+"|", packed, l.channel())
	vals, _ := res.([]any)
	if err != nil || len(vals) == 0 {
		l.forget(lease)
		if err == nil {
			err = fmt.Errorf("unexpected reply %v", res)
		}
		return Reservation{}, l.fail("reserve", err)
	}
	switch vals[0] {
	case "turn":
		l.forget(lease)
		return Reservation{}, ErrNotYourTurn
	case "full":
		l.forget(lease)
		r := Reservation{Index: -1}
		if len(vals) == 1+len(cands) {
			r.Active = toInts(vals[1:])
		}
		return r, ErrFull
	case "ok":
	default:
		l.forget(lease)
		return Reservation{}, l.fail("reserve", fmt.Errorf("unexpected reply %v", vals))
	}
	idx := int(toInt(vals[1])) - 1
	if idx < 0 || idx >= len(cands) || len(vals) != 2+len(cands) {
		l.forget(lease)
		return Reservation{}, l.fail("reserve", fmt.Errorf("unexpected reply %v", vals))
	}
	l.mu.Lock()
	l.held[lease] = cands[idx].Worker
	if waitID != "" {
		delete(l.waiters, me)
	}
	l.mu.Unlock()
	return Reservation{Worker: cands[idx].Worker, Index: idx, Lease: lease, Active: toInts(vals[2:])}, nil
}

// Adopt records a slot on worker reserved while degraded, from the local
// view; the next renewal that reaches Redis publishes it, so the other
// replicas count it once Redis is back.
func (l *Ledger) Adopt(worker string) Reservation {
	l.mu.Lock()
	lease := l.newLeaseLocked()
	l.held[lease] = worker
	l.mu.Unlock()
	return Reservation{Worker: worker, Lease: lease}
}

// newLeaseLocked numbers a new lease of this replica; l.mu held.
func (l *Ledger) newLeaseLocked() string {
	l.seq++
	return l.leasePrefix() + strconv.FormatUint(l.seq, 10)
}

// leasePrefix starts every lease id of this replica.
func (l *Ledger) leasePrefix() string { return l.cfg.Replica + "/" }

// Release gives a reservation back and wakes the replicas waiting for the
// slot. If Redis cannot be reached the lease expires by itself within
// LeaseTTL. Releasing twice does nothing.
func (l *Ledger) Release(ctx context.Context, r Reservation) error {
	if r.Lease == "" {
		return nil
	}
	l.renewMu.RLock()
	defer l.renewMu.RUnlock()
	if !l.forget(r.Lease) {
		return nil
	}
	if l.degraded.Load() {
		return ErrDegraded // the first renewal that reaches Redis removes it
	}
	_, err := l.run(ctx, releaseScript, []string{l.leasesKey(), l.countsKey()}, r.Worker, r.Lease, l.channel())
	if err != nil {
		return l.fail("release", err)
	}
	return nil
}

// Wait puts request id of model on the shared waiting list, so that no
// other replica binds a younger request for the model before it.
func (l *Ledger) Wait(ctx context.Context, model, id string) error {
	m := l.member(id)
	// Not during a renewal: its reconciliation would take a waiter the
	// script had added but l.waiters did not yet hold for a stray one.
	l.renewMu.RLock()
	defer l.renewMu.RUnlock()
	l.mu.Lock()
	l.models[model] = true
	l.mu.Unlock()
	us := "" // unknown until Redis answers; the renewal then sets it
	err := ErrDegraded
	if !l.degraded.Load() {
		var res any
		if res, err = l.run(ctx, waitScript, []string{l.key("wait", model), l.key("waitexp", model)}, m, l.cfg.LeaseTTL.Milliseconds()); err != nil {
			err = l.fail("wait", err)
		} else {
			us, _ = res.(string)
		}
	}
	l.mu.Lock()
	l.waiters[m] = waiter{model: model, us: us}
	l.mu.Unlock()
	return err
}

// Unwait takes request id off model's waiting list (it was bound, or gave
// up) and wakes the replicas whose requests are now the oldest.
func (l *Ledger) Unwait(ctx context.Context, model, id string) error {
	m := l.member(id)
	l.renewMu.RLock()
	defer l.renewMu.RUnlock()
	l.mu.Lock()
	_, ok := l.waiters[m]
	delete(l.waiters, m)
	l.mu.Unlock()
	if !ok || l.degraded.Load() {
		return nil // while degraded, the first renewal that reaches Redis removes it
	}
	_, err := l.run(ctx, unwaitScript, []string{l.key("wait", model), l.key("waitexp", model)}, m, l.channel(), model)
	if err != nil {
		return l.fail("unwait", err)
	}
	return nil
}

// InFlight returns the shared in-flight count of each worker, reaping
// expired leases first.
func (l *Ledger) InFlight(ctx context.Context, workers ...string) ([]int, error) {
	args := make([]any, len(workers))
	for i, w := range workers {
		args[i] = w
	}
	res, err := l.run(ctx, countScript, []string{l.leasesKey(), l.countsKey()}, args...)
	if err != nil {
		return nil, fmt.Errorf("shared: count leases: %w", err)
	}
	vals, _ := res.([]any)
	return toInts(vals), nil
}

// Run renews this replica's leases and waiters every RenewEvery, probes
// Redis while degraded and resynchronises when it answers, and relays
// wake-ups from the other replicas, until ctx ends. It does not release
// the leases on return: the caller releases what it still holds.
func (l *Ledger) Run(ctx context.Context) {
	sub := l.rdb.Subscribe(ctx, l.channel())
	defer sub.Close()
	if _, err := sub.Receive(ctx); err != nil { // the subscription's confirmation
		_ = l.fail("subscribe", err) // go-redis resubscribes when Redis answers
	}
	if l.subscribed != nil {
		close(l.subscribed)
	}
	msgs := sub.Channel()
	tick := time.NewTicker(l.cfg.RenewEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-msgs:
			l.notify()
		case <-tick.C:
			l.renew(ctx)
			l.notify()
		}
	}
}

// renew extends every lease and waiter this replica holds, re-creating any
// Redis lost; while degraded it is also the probe that ends the degraded
// state. Run calls it every RenewEvery.
func (l *Ledger) renew(ctx context.Context) {
	l.renewMu.Lock()
	defer l.renewMu.Unlock()
	l.mu.Lock()
	keys := make([]string, 0, 2+2*len(l.waiters))
	keys = append(keys, l.leasesKey(), l.countsKey())
	args := make([]any, 0, 2+2*len(l.held)+2*len(l.waiters))
	args = append(args, l.cfg.LeaseTTL.Milliseconds(), 0)
	leases := 0
	for lease, w := range l.held {
		if w == "" { // a Reserve in flight; its script sets the expiry
			continue
		}
		args = append(args, w, lease)
		leases++
	}
	args[1] = leases
	// Waiters queued while degraded have no enqueue time on the server's
	// clock; they take this replica's.
	unknown := map[string]string{}
	for m, wt := range l.waiters {
		us := wt.us
		if us == "" {
			us = strconv.FormatInt(time.Now().UnixMicro(), 10)
			unknown[m] = us
		}
		keys = append(keys, l.key("wait", wt.model), l.key("waitexp", wt.model))
		args = append(args, m, us)
	}
	l.mu.Unlock()
	if l.beforeRenew != nil {
		l.beforeRenew()
	}
	res, err := l.run(ctx, renewScript, keys, args...)
	if err != nil {
		_ = l.fail("renew", err)
		return
	}
	if err := l.reconcile(ctx); err != nil {
		_ = l.fail("renew", err)
		return
	}
	if len(unknown) > 0 {
		l.mu.Lock()
		for m, us := range unknown {
			if wt, ok := l.waiters[m]; ok && wt.us == "" {
				wt.us = us
				l.waiters[m] = wt
			}
		}
		l.mu.Unlock()
	}
	if n := toInt(res); n > 0 {
		l.log.Warn("shared state: re-created leases and waiters Redis had lost", "count", n)
	}
	if l.degraded.CompareAndSwap(true, false) {
		l.log.Warn("shared state: Redis answers again; scheduling across replicas resumed", "leases", leases)
	}
}

// reconcile makes Redis hold no lease or waiter of this replica but the ones
// it holds now, and forgets the models it need not look at again. A renewal
// sends only what it holds; what this replica gave up without Redis hearing
// of it would otherwise stay until it expired, a lease holding its slot and
// a waiter, still the oldest, every other replica's turn, for up to
// LeaseTTL:
//   - leases released and waiters gone while Redis could not be told;
//   - a pick whose script ran but whose answer came too late, given up
//     here, its lease (and, if it bound a waiter, the waiter) left there;
//   - a waiter a Reserve bound while the renewal was on its way, which the
//     renewal's script put back;
//   - anything of an earlier process under this replica's name.
//
// The set kept is read after the renewal's script, under l.mu: every
// lease numbered up to l.seq is held there or was given up, since Reserve
// and Adopt number a lease and hold it in one step, and Wait, Unwait and
// Release do not run during a renewal. Leases numbered later are left
// alone; a Reserve in flight holds its lease already.
//
// The waiting lists looked at are those of the models in l.models: every
// model Wait was called for, until a reconcile finds no waiter of this
// replica for it, before its script and after. That script removed every
// stray of the model (none can be added meanwhile: Wait does not run
// during a renewal), so the model is forgotten, and a renewal sends the
// keys of the models waited for now, not of every model ever named.
func (l *Ledger) reconcile(ctx context.Context) error {
	l.mu.Lock()
	keys := make([]string, 0, 2+2*len(l.models))
	keys = append(keys, l.leasesKey(), l.countsKey())
	for model := range l.models {
		keys = append(keys, l.key("wait", model), l.key("waitexp", model))
	}
	args := make([]any, 0, 4+len(l.held)+len(l.waiters))
	args = append(args, l.leasePrefix(), l.cfg.Replica+"|", l.seq, l.channel())
	for lease := range l.held {
		args = append(args, lease)
	}
	idle := maps.Clone(l.models) // the models without a waiter now
	for m, wt := range l.waiters {
		args = append(args, m)
		delete(idle, wt.model)
	}
	l.mu.Unlock()
	res, err := l.run(ctx, reconcileScript, keys, args...)
	if err != nil {
		return err
	}
	if n := toInt(res); n > 0 {
		l.log.Info("shared state: removed leases and waiters this replica no longer holds", "count", n)
	}
	l.mu.Lock()
	for _, wt := range l.waiters {
		delete(idle, wt.model)
	}
	for model := range idle {
		delete(l.models, model)
	}
	l.mu.Unlock()
	return nil
}

func (l *Ledger) notify() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

// forget drops a lease from the held set and reports whether it was held.
func (l *Ledger) forget(lease string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	_, ok := l.held[lease]
	delete(l.held, lease)
	return ok
}

// run runs a script within CallTimeout and notes the success.
func (l *Ledger) run(ctx context.Context, s *redis.Script, keys []string, args ...any) (any, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.CallTimeout)
	defer cancel()
	res, err := s.Run(ctx, l.rdb, keys, args...).Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, err
	}
	l.lastOK.Store(time.Now().UnixNano())
	return res, nil
}

// fail marks the ledger degraded, logging the transition once, and returns
// ErrDegraded wrapping the cause.
func (l *Ledger) fail(op string, err error) error {
	if l.degraded.CompareAndSwap(false, true) {
		l.log.Error("shared state unavailable: scheduling on this replica's local view and its share of each worker until Redis answers",
			"op", op, "err", err, "replicas", l.cfg.Replicas)
	}
	return fmt.Errorf("%w: %s: %v", ErrDegraded, op, err)
}

func toInts(vals []any) []int {
	out := make([]int, len(vals))
	for i, v := range vals {
		out[i] = int(toInt(v))
	}
	return out
}

func toInt(v any) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		n, _ := strconv.ParseInt(x, 10, 64)
		return n
	}
	return 0
}
