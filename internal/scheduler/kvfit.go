package scheduler

import (
	"fmt"
	"math"
	"time"
)

// The KV-fit rule (Config.KVFit, admission.kv_fit, on by default): pass
// over an eligible worker whose KV cache cannot take the request's prompt
// now, and when no eligible worker can, hold the request in Sluice's
// queue rather than inside a worker.
//
// A paged engine (vLLM, and the simulators) admits a request only when
// its prompt fits in the KV cache left free by the requests it is already
// running; until then the request waits inside the worker, behind work
// Sluice cannot reorder, however soon another card frees. A slot free
// under the concurrency limit does not mean room in the cache: a card
// with a small cache and two long conversations in flight has free slots
// and no room. The rule is a filter rather than a score term: a weight
// would have to be set against every other term (a cached prefix, an
// idle card) for a wait no term measures, while "the prompt does not fit
// there now" is an estimate of a fact, not a preference.
//
// What the rule knows of a worker's cache:
//
//   - its capacity, Snapshot.KVPoolTokens; 0 (unknown, or one cache per
//     slot) and the rule does nothing for the worker: it is never passed
//     over, and counts as room for the request, since an eligible worker
//     without a shared cache has a free slot under its limit;
//   - the tokens Sluice's own requests in flight there will hold: the
//     job cost, prompt plus expected output of each (worker.cost),
//     current to the pick and an upper estimate of what they hold now
//     (their output is not all generated yet, but a sequence still
//     growing claims that room);
//   - the worker's own reading of its use, Snapshot.KVPressure × the
//     capacity, while fresh (Config.StaleAfter): it covers traffic Sluice
//     does not see (other replicas, other clients) but is up to a scrape
//     interval old, missing what was bound since and holding what
//     finished since.
//
// The tokens in use are the larger of the last two: each bounds a
// different part from below (Sluice's own requests include those the
// reading saw, so adding them would count those twice). The prompt fits
// when prompt tokens ≤ capacity − in use: the whole prompt, though a
// cached prefix may need fewer new blocks in vLLM (the simulators'
// engines admit on the whole prompt too).
//
// When no eligible worker fits, the request waits in Sluice's queue for
// one that does, bound to whichever frees first as any waiting request
// is; a worker with none of this replica's requests in flight is kept,
// so a stale or foreign reading cannot hold a request with nothing of
// Sluice's to wait for. A held request at the head of the queue does not
// hold back those behind it: one that a worker can take goes first,
// within the queue's aging bound (MaxOvertake), as for prefix affinity
// (overtakeLocked). With a shared Ledger nothing is held (its waiting
// list orders binds across replicas): the rule only passes over. The
// baseline policies never apply it. The record of each decision says of
// every worker passed over how big the prompt was, the room estimated
// and where the estimate came from (see kvRoom.why).

// kvRoom is the KV-fit rule's estimate of one worker's free KV cache at
// a pick.
type kvRoom struct {
	pool int // capacity in tokens; 0 when unknown (the rule does nothing)
	used int // tokens estimated in use
	// What used came from: the worker's reading (src, its age) when it
	// said more than Sluice's own requests (active, of job cost used).
	reported bool
	src      string
	age      time.Duration
	active   int
}

// kvRoomOf estimates the free KV cache of a worker whose snapshot is snap
// and on which Sluice has active requests in flight of job cost own.
func kvRoomOf(snap *Snapshot, own float64, active int, now time.Time, staleAfter time.Duration) kvRoom {
	r := kvRoom{pool: snap.KVPoolTokens, active: active}
	if r.pool <= 0 {
		return kvRoom{}
	}
	r.used = int(math.Ceil(own))
	if kv := &snap.KVPressure; fresh(kv, now, staleAfter) {
		if rep := int(math.Ceil(kv.Value * float64(r.pool))); rep > r.used {
			r.used, r.reported, r.src, r.age = rep, true, kv.Source, now.Sub(kv.At)
		}
	}
	r.used = min(max(r.used, 0), r.pool)
	return r
}

// free is the room estimated left in the cache.
func (r *kvRoom) free() int { return r.pool - r.used }

// fits reports whether a prompt of the given tokens fits now; always
// when the capacity or the prompt's size is unknown.
func (r *kvRoom) fits(prompt int) bool { return r.pool <= 0 || prompt <= r.free() }

// why says, for the record, why a worker was passed over.
func (r *kvRoom) why(prompt int) string {
	var from string
	if r.reported {
		from = fmt.Sprintf("%d of %d in use per %s, read %s ago", r.used, r.pool, r.src, r.age.Round(time.Millisecond))
	} else {
		from = fmt.Sprintf("%d of %d held by Sluice's %d in flight, prompt + expected output", r.used, r.pool, r.active)
	}
	return fmt.Sprintf("prompt of ~%d tokens does not fit its free KV cache of ~%d tokens (%s)", prompt, r.free(), from)
}

// kvFitFilter is the KV-fit rule as a filter: of the eligible workers it
// drops those that cannot take the request's prompt now (all of them when
// none can, but those with nothing of this replica's in flight; none when
// none can and a shared Ledger orders the waiting), and sets the pick's
// kvHeld when it dropped every one.
type kvFitFilter struct{}

func (kvFitFilter) keep(p *pick, in []int32, why uint8) []int32 {
	prompt := p.req.PromptTokens
	if prompt <= 0 {
		return in
	}
	fits := func(v *view) bool {
		r := kvRoomOf(v.snap, v.cost, v.active, p.env.Now, p.env.StaleAfter)
		return r.fits(prompt)
	}
	fit, miss := 0, 0
	for _, i := range in {
		if fits(&p.views[i]) {
			fit++
		} else {
			miss++
		}
	}
	if miss == 0 || fit == 0 && p.shared {
		return in
	}
	out := keepIf(p, in, why, func(v *view) bool { return fits(v) || (fit == 0 && v.active == 0) })
	p.kvHeld = len(out) == 0
	return out
}

// explain puts the estimate in words from the job cost the rule read,
// which the record's slot keeps.
func (kvFitFilter) explain(pr *pickRecord, sl *slot) string {
	room := kvRoomOf(sl.snap, sl.jobCost, int(sl.active), pr.env.Now, pr.env.StaleAfter)
	return room.why(pr.req.PromptTokens)
}
