package scheduler

import (
	"fmt"
	"math"
	"time"

	"github.com/sluice-router/sluice/internal/snapshot"
)

// The KV-fit rule (Config.KVFit, docs/routing.md): pass over an eligible
// worker whose KV cache cannot take the prompt now, and when none can,
// hold the request in Sluice's queue rather than inside a worker, behind
// work Sluice cannot reorder. The tokens in use are the larger of
// Sluice's own job cost there and the worker's fresh KVPressure times its
// pool; a worker with no known pool is never passed over. When nobody
// fits, a worker with none of this replica's requests is kept, so a stale
// or foreign reading cannot hold a request with nothing to wait for; with
// a shared Ledger nothing is held.

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
func kvRoomOf(snap *snapshot.Snapshot, own float64, active int, now time.Time, staleAfter time.Duration) kvRoom {
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

// kvFitFilter is the KV-fit rule as a filter; it sets the pick's kvHeld
// when it dropped every eligible worker.
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
