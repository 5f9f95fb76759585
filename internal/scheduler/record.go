package scheduler

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"time"
	"unsafe"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/stats"
)

// pickRecord is a decision record as a pick makes it. A record lists every
// worker with the words and numbers that explain it, but it is read
// rarely (the API, the dashboard, the decision log file) while a pick is
// made for every request: so a pick keeps one slot of plain values per
// worker, and the record's Candidates are built from them, with every
// term and limit recomputed, when the record is first read
// (pickRecord.explain, run by decisions.Record.Explain). Everything here
// is of decision time and never changes afterwards: snapshots and stats
// are immutable values.
type pickRecord struct {
	rec decisions.Record
	// The slots and their refs, chunkLen workers a chunk, in
	// configuration order; n is how many workers. slotBuf and refBuf hold
	// the chunks of up to 64 workers, saving two allocations.
	slots   []*slotChunk
	refs    []*refChunk
	n       int
	slotBuf [8]*slotChunk
	refBuf  [8]*refChunk

	// What the terms and limits are recomputed from.
	env    Env     // of the decision; env.Req is &req
	req    Request // the request, as placed
	terms  []WeightedTerm
	limits *LimitConfig // the learning limits, nil when fixed or not scored
	floor  float64
	waited time.Duration

	chosen int  // slot of the chosen worker, -1 when none
	scored bool // the eligible workers were scored and one chosen
	// unscored says the pick was a refusal's: nobody was scored under the
	// lock, and the score is computed when the record is read.
	unscored bool
	shared   bool // the shared ledger chose: its choice ranks first
	pending  bool // the ledger has yet to choose (patchShared completes it)
	// adapter is the request's LoRA adapter as the pick saw it (nil
	// when it names none), for the adapter rule's words: a copy, kept
	// apart so that a record without one is smaller.
	adapter *adapterPick
}

// slot is what a record keeps of one worker besides its slotRefs: what
// its limit was computed from and, for an eligible worker, what it was
// scored on. It is 72 bytes.
type slot struct {
	jobCost     float64 // Candidate.JobCost as scored
	prefixMatch float64 // Candidate.PrefixMatch as scored
	total       float64 // the score, when scored
	prefix      float64 // limitState.prefix: one more stream for a cached prefix
	lastPick    uint64  // for the rank's tie-break
	limit, cap  int
	active      int32 // Sluice's in-flight count (the record's Active)
	scored      int32 // the in-flight count as scored (the shared ledger's, when it answered)
	why         uint8 // one of the why* reasons
	source      limitSource
	prefixSrc   uint8 // Candidate.PrefixSource, an index into prefixSources
	loadable    bool  // it could load the request's adapter (adapter.go)
	kvSeq       int64 // Candidate.KVSeq as scored
}

// slotRefs is what a record keeps of one worker by reference: its name,
// telemetry and stats (immutable values).
type slotRefs struct {
	name string
	snap *Snapshot
	st   *stats.WorkerStats
}

// chunkLen is how many workers' slots a slotChunk holds, and refs a
// refChunk.
const chunkLen = 8

// slotChunk and refChunk are the slots and refs of chunkLen consecutive
// workers, as a record keeps them. A chunk is never written once a
// record holds it, so records share one where nothing in it changed
// between their picks: from one pick to the next most workers' slots are
// the same (an idle worker's all are; the chosen one's last pick moves),
// and a pick then allocates a chunk or two instead of every worker's
// slots. Slots and refs are chunked apart because they change apart: a
// pick moves numbers, a scrape replaces a snapshot; and a slotChunk holds
// no pointer, so the one a pick allocates costs the GC nothing to scan.
// The GC frees a chunk when no record holds it.
type (
	slotChunk [chunkLen]slot
	refChunk  [chunkLen]slotRefs
)

// holdsSlots reports whether ch holds exactly sl (at most chunkLen), and
// holdsRefs whether rc holds exactly rf, bit for bit: the same numbers,
// and the same name, snapshot and stats by address. They compare memory,
// padding included, which is always zero: slots are only ever written
// field by field or copied, into the zeroed memory of make and new.
// (Were it not, the chunk would be copied anew: equal bytes are equal
// values either way.)
func (ch *slotChunk) holdsSlots(sl []slot) bool {
	return string(bytesOf(ch[:len(sl)])) == string(bytesOf(sl))
}

func (rc *refChunk) holdsRefs(rf []slotRefs) bool {
	return string(bytesOf(rc[:len(rf)])) == string(bytesOf(rf))
}

// bytesOf is the memory of s, to be compared, never written.
func bytesOf[T any](s []T) []byte {
	if len(s) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(&s[0])), len(s)*int(unsafe.Sizeof(s[0])))
}

// slot returns worker i's slot; ref its refs.
func (pr *pickRecord) slot(i int) *slot    { return &pr.slots[i/chunkLen][i%chunkLen] }
func (pr *pickRecord) ref(i int) *slotRefs { return &pr.refs[i/chunkLen][i%chunkLen] }

// prefixSources are the values of Candidate.PrefixSource, as a slot keeps
// them: a number instead of a string. A source beliefsLocked may set
// must be listed here and in prefixSourceCode; the last, a source that
// is not, is what the record says of one that was forgotten.
var prefixSources = [9]string{"", prefixSourceIndex, prefixSourceReport, prefixSourceShared, prefixSourceSession, prefixSourceKV, prefixSourceKVLost, prefixSourceKVSent, prefixSourceUnlisted}

// prefixSourceUnlisted is a source missing from prefixSources.
const prefixSourceUnlisted = "unlisted source (a slip in the scheduler: please report it)"

func prefixSourceCode(src string) uint8 {
	switch src { // a switch, not a loop: it runs for every eligible worker
	case "":
		return 0
	case prefixSourceIndex:
		return 1
	case prefixSourceReport:
		return 2
	case prefixSourceShared:
		return 3
	case prefixSourceSession:
		return 4
	case prefixSourceKV:
		return 5
	case prefixSourceKVLost:
		return 6
	case prefixSourceKVSent:
		return 7
	}
	// Not a panic: it runs under the scheduler's lock, in a pick, and a
	// forgotten source is a word missing from a record, not a reason to
	// fail the request (TestPrefixSourceCode_RoundTrips keeps the list).
	return 8
}

// newPickRecordLocked starts the record of pick p.
func (s *Scheduler) newPickRecordLocked(p *pick) *pickRecord {
	pr := &pickRecord{req: p.req, terms: s.terms, floor: p.floor, waited: p.waited, chosen: -1}
	if p.adapter != nil {
		a := *p.adapter
		pr.adapter = &a
	}
	pr.env = Env{Now: p.env.Now, StaleAfter: s.cfg.StaleAfter, Req: &pr.req}
	if p.learning {
		pr.limits = s.limits
	}
	s.fillRecordLocked(&pr.rec, p.req, p.env.Now)
	return pr
}

// keepLocked writes every worker's slot of the record, in one pass over
// p's views: what its limit was computed from and why it is or is not
// eligible and, for an eligible worker, what it was chosen among on and,
// when pr was scored, its total in s.scratch. Then it gives pr its chunks
// of them: the latest record's where they hold the same, new ones
// elsewhere. It runs once the picker has chosen, before anything about
// the pick changes a worker.
func (pr *pickRecord) keepLocked(s *Scheduler, p *pick) {
	n := len(p.views)
	sc := &s.scratch
	if cap(sc.slots) < n {
		sc.slots, sc.refs = make([]slot, n), make([]slotRefs, n)
	}
	slots, refs := sc.slots[:n], sc.refs[:n]
	// A record that scores workers becomes the latest to have scored each
	// of them (lastScoredLocked): a number on each, not a pointer written
	// to every worker at every pick, and a worker it does not score keeps
	// the previous one by pointer.
	scoring := pr.scored && !pr.pending
	seq := s.scoredSeq + 1
	j := 0 // p.elig[j] is the next eligible view: elig is in view order
	for i := range p.views {
		v := &p.views[i]
		// Field by field, every one: a struct literal would be copied in
		// with a bulk write barrier, slow while the GC runs, and the
		// slots are the previous pick's.
		ref, sl := &refs[i], &slots[i]
		setStr(&ref.name, v.w.spec.Name)
		setPtr(&ref.snap, v.snap)
		setPtr(&ref.st, v.st)
		sl.prefix, sl.lastPick, sl.limit, sl.cap = v.lim.prefix, v.w.lastPick, v.lim.limit, v.lim.cap
		sl.active, sl.why, sl.source = int32(v.w.active), v.why, v.lim.source
		sl.loadable = v.loadable
		sl.total = 0
		if j < len(p.elig) && int(p.elig[j]) == i {
			c := &p.cands[j]
			sl.jobCost, sl.prefixMatch, sl.scored, sl.prefixSrc = c.JobCost, c.PrefixMatch, int32(c.Active), prefixSourceCode(c.PrefixSource)
			sl.kvSeq = c.KVSeq
			if pr.scored {
				sl.total = sc.total[j]
				if scoring {
					v.w.lastSeq, v.w.lastIdx = seq, i
				}
			}
			j++
			continue
		}
		if scoring && v.w.lastSeq == s.scoredSeq && v.w.lastSeq != 0 {
			v.w.last, v.w.lastSeq = s.lastScored, 0 // scored by the latest until now
		}
		sl.jobCost, sl.prefixMatch, sl.scored, sl.prefixSrc, sl.kvSeq = 0, 0, 0, 0, 0
		if v.why == whyKVFit {
			sl.jobCost = v.w.cost // what the rule read, for the record's words
		}
	}
	prevSlots, prevRefs := sc.slotChunks, sc.refChunks
	nc := (n + chunkLen - 1) / chunkLen
	slotChunks, refChunks := pr.slotBuf[:0], pr.refBuf[:0]
	if nc > len(pr.slotBuf) {
		slotChunks, refChunks = make([]*slotChunk, 0, nc), make([]*refChunk, 0, nc)
	}
	for c := range nc {
		lo, hi := c*chunkLen, min(n, (c+1)*chunkLen)
		if c < len(prevSlots) && prevSlots[c].holdsSlots(slots[lo:hi]) {
			slotChunks = append(slotChunks, prevSlots[c])
		} else {
			ch := new(slotChunk)
			copy(ch[:], slots[lo:hi])
			slotChunks = append(slotChunks, ch)
		}
		if c < len(prevRefs) && prevRefs[c].holdsRefs(refs[lo:hi]) {
			refChunks = append(refChunks, prevRefs[c])
		} else {
			rc := new(refChunk)
			copy(rc[:], refs[lo:hi])
			refChunks = append(refChunks, rc)
		}
	}
	pr.slots, pr.refs, pr.n = slotChunks, refChunks, n
	sc.slotChunks, sc.refChunks = slotChunks, refChunks
	if scoring {
		s.lastScored, s.scoredSeq = &pr.rec, seq
	}
	pr.rec.Summary = decisions.Summary{Candidates: n, Eligible: len(p.cands)}
	if pr.scored && pr.chosen >= 0 && !pr.pending {
		pr.rec.Summary.Score = slots[pr.chosen].total
	}
}

// explain builds r's candidates from pr's slots; r is &pr.rec.
func (pr *pickRecord) explain(r *decisions.Record) {
	cs := make([]decisions.Candidate, pr.n)
	var cands []Candidate // the eligible ones as scored
	var at []int          // their indexes in cs
	for i := range pr.n {
		sl, ref, c := pr.slot(i), pr.ref(i), &cs[i]
		c.Worker, c.Active, c.Limit, c.Eligible = ref.name, int(sl.active), sl.limit, sl.why == whyEligible
		c.LimitSource = sl.source.String()
		if sl.why == whyEligible {
			cands = append(cands, Candidate{Name: ref.name, Active: int(sl.scored), JobCost: sl.jobCost, Snap: ref.snap, Stats: ref.st,
				Belief: Belief{PrefixMatch: sl.prefixMatch, PrefixSource: prefixSources[sl.prefixSrc], KVSeq: sl.kvSeq}})
			at = append(at, i)
			if pr.scored {
				// Active as scored: with a Ledger, the count across replicas.
				c.Active, c.Total = int(sl.scored), sl.total
			}
		} else {
			c.Why = filters[sl.why].explain(pr, sl, ref)
		}
		if pr.limits != nil {
			// This replica's in-flight count, which the limit saw.
			active := int(sl.active)
			var st limitState
			pr.limits.limitOf(&st, pr.env.StaleAfter, sl.cap, srcLearned, active, ref.st, ref.snap, pr.floor, pr.waited, pr.env.Now)
			if sl.prefix > 0 { // made one stream over by affinityBorrowLocked
				st.limit, st.prefix = active+1, sl.prefix
			}
			c.LimitReason = st.String()
		}
	}
	r.Candidates = cs
	switch {
	case pr.scored:
		tot := make([]float64, len(at))
		for j, i := range at {
			tot[j] = pr.slot(i).total
		}
		pr.explainScores(r, cands, at, tot)
	case pr.unscored && len(cands) > 0:
		// A refusal's pick scored nobody: the score is the same computed
		// now, from the same values (terms are pure).
		var sc scratch
		tot := totals(pr.terms, &pr.env, cands, &sc)
		for j, i := range at {
			cs[i].Total = tot[j]
		}
		pr.explainScores(r, cands, at, tot)
	case pr.chosen >= 0: // a baseline policy's choice
		cs[pr.chosen].Rank = 1
	}
}

// explainScores fills in the terms and ranks of the eligible candidates
// (cands, at their indexes at in r.Candidates, with totals tot) and the
// reason in words.
func (pr *pickRecord) explainScores(r *decisions.Record, cands []Candidate, at []int, tot []float64) {
	keys := make([]rankKey, len(at))
	won := -1 // with a Ledger, its choice: ties and shared limits were its
	for j, i := range at {
		sl := pr.slot(i)
		keys[j] = rankKey{tot[j], sl.lastPick, i}
		if pr.shared && i == pr.chosen {
			won = j
		}
	}
	for j, ts := range explain(pr.terms, &pr.env, cands) {
		r.Candidates[at[j]].Terms = ts
	}
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		switch {
		case a == won:
			return -1
		case b == won:
			return 1
		case keys[a].less(keys[b]):
			return -1
		case keys[b].less(keys[a]):
			return 1
		}
		return 0
	})
	for rank, j := range order {
		r.Candidates[at[j]].Rank = rank + 1
	}
	first := keys[order[0]].total
	switch {
	case r.Chosen == "":
		// A refusal's record: the ranks say who would have gone first,
		// its reason why nobody did (refuseWithLocked).
	case len(order) == 1:
		r.Reason = fmt.Sprintf("only eligible worker (score %.2f)", first)
	case won >= 0 && keys[order[1]].total < first:
		c := &r.Candidates[at[order[1]]]
		r.Reason = fmt.Sprintf("lowest score %.2f with room across replicas; %s at %.2f is at its limit there (%d/%d)", first, cands[order[1]].Name, keys[order[1]].total, c.Active, c.Limit)
	case won >= 0 && keys[order[1]].total == first:
		r.Reason = fmt.Sprintf("lowest score %.2f, tied with %s; the least recently picked by any replica (the shared ledger's pick sequence), then the first listed, wins", first, cands[order[1]].Name)
	case keys[order[1]].total == first:
		r.Reason = fmt.Sprintf("lowest score %.2f, tied with %s; the least recently picked, then the first listed, wins", first, cands[order[1]].Name)
	default:
		r.Reason = fmt.Sprintf("lowest score %.2f (next: %s at %.2f)", first, cands[order[1]].Name, keys[order[1]].total)
	}
}

func (s *Scheduler) newRecordLocked(req Request, now time.Time) *decisions.Record {
	rec := new(decisions.Record)
	s.fillRecordLocked(rec, req, now)
	return rec
}

// fillRecordLocked fills in a new record's header: its ID and what it
// says of the request.
func (s *Scheduler) fillRecordLocked(rec *decisions.Record, req Request, now time.Time) {
	s.ids++
	var id [64]byte
	*rec = decisions.Record{
		ID:           string(strconv.AppendUint(append(append(id[:0], s.prefix...), '-'), s.ids, 10)),
		Time:         now,
		Model:        req.Model,
		Policy:       string(s.cfg.Policy),
		Attempt:      req.Attempt,
		PromptTokens: req.PromptTokens,
		PromptSource: req.PromptSource,
		MaxTokens:    req.MaxTokens,
		Class:        req.Class,
		Tenant:       req.Tenant,
		Session:      sessionLabel(&req),
	}
	s.stampSharedLocked(rec)
	out, src := s.est.estimate(&req)
	rec.ExpectedOutputTokens, rec.EstimateSource = int(math.Round(out)), src
}
