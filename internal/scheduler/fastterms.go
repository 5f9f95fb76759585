package scheduler

import (
	"time"

	"github.com/sluice-router/sluice/internal/stats"
)

// The kinds of term fastTotals computes itself; any other term's values
// come from its own Score.
const (
	kindOther uint8 = iota
	kindActive
	kindQueue
	kindLatency
	kindJob
	kindThroughput
	kindKV
	kindGPU
	kindPrefix
)

// kindOf returns the kind of a term, kindOther for one fastTotals does
// not compute itself.
func kindOf(t Term) uint8 {
	switch t.(type) {
	case activeRequests:
		return kindActive
	case queueLength:
		return kindQueue
	case latency:
		return kindLatency
	case jobCost:
		return kindJob
	case throughput:
		return kindThroughput
	case kvPressure:
		return kindKV
	case gpuUtil:
		return kindGPU
	case prefixMatch:
		return kindPrefix
	}
	return kindOther
}

// fastTotals is totals for any list of terms, in two passes over the
// candidates instead of one or two per term. Pass one gathers what the
// shipped terms normalise by (maxima, confidence-weighted means); any
// other term is run through its own Score first, into scratch. Pass two
// adds each term in over every candidate, in the list's order.
// Every value is computed by the same operations in the same order as the
// terms' Score methods and termTotals, so the totals are bit for bit the
// same (TestFastTotals).
func fastTotals(terms []WeightedTerm, env *Env, cands []Candidate, sc *scratch) {
	nt := len(terms)
	if cap(sc.kinds) < nt {
		sc.kinds, sc.weights, sc.custom = make([]uint8, nt), make([]float64, nt), make([][]float64, nt)
	}
	kinds, w, custom := sc.kinds[:nt], sc.weights[:nt], sc.custom[:nt]
	for t := range terms {
		kinds[t], w[t] = kindOf(terms[t].Term), signedWeight(terms[t])
		if kinds[t] == kindOther {
			if cap(custom[t]) < len(cands) {
				custom[t] = make([]float64, len(cands))
			}
			custom[t] = custom[t][:len(cands)]
			terms[t].Term.Score(env, cands, sc.raw, custom[t])
		}
	}
	tele := sc.tele[:len(cands)]
	// Pass one: what the terms normalise by (see telemetryTerm,
	// ratioToMax and jobCost.Score).
	var qSum, qW, kvSum, kvW, gpuSum, gpuW float64
	var ttftMax, tpsMax, jobMax float64
	var ttftOdd, tpsOdd bool // a candidate without history, or below 0
	var staleAfter time.Duration
	if env != nil {
		staleAfter = env.StaleAfter
	}
	for i := range cands {
		c, ti := &cands[i], &tele[i]
		if ti.snap != c.Snap || ti.st != c.Stats || ti.staleAfter != staleAfter || staleAfter > 0 {
			ti.read(env, c.Snap, c.Stats) // else what it read last holds: nothing goes stale
		}
		if ti.qc > 0 {
			qSum += ti.qc * ti.q
			qW += ti.qc
		}
		if ti.kvc > 0 {
			kvSum += ti.kvc * ti.kv
			kvW += ti.kvc
		}
		if ti.gpuc > 0 {
			gpuSum += ti.gpuc * ti.gpu
			gpuW += ti.gpuc
		}
		if ti.ttftKnown {
			ttftMax = max(ttftMax, ti.ttft)
			ttftOdd = ttftOdd || ti.ttft < 0
		} else {
			ttftOdd = true
		}
		if ti.tpsKnown {
			tpsMax = max(tpsMax, ti.tps)
			tpsOdd = tpsOdd || ti.tps < 0
		} else {
			tpsOdd = true
		}
		jobMax = max(jobMax, c.JobCost)
	}
	qNeutral, kvNeutral, gpuNeutral := 0.0, 0.5, 0.5 // the terms' fallbacks
	if qW > 0 {
		qNeutral = qSum / qW
	}
	if kvW > 0 {
		kvNeutral = kvSum / kvW
	}
	if gpuW > 0 {
		gpuNeutral = gpuSum / gpuW
	}
	// A ratio that needs its neutral value (a candidate without history)
	// is normalised by the term itself, into scratch.
	var ttftNorm, tpsNorm []float64
	if ttftOdd {
		ttftNorm = sc.ratioNorms(0, len(cands))
		ratioToMax(cands, sc.raw, ttftNorm, emaTTFT)
	}
	if tpsOdd {
		tpsNorm = sc.ratioNorms(1, len(cands))
		ratioToMax(cands, sc.raw, tpsNorm, emaDecodeTPS)
	}
	// Pass two: each term over every candidate, added in term order; a
	// candidate's total takes the same additions in the same order as
	// termTotals', with the term's kind switched on once, not per
	// candidate.
	out := sc.total[:len(cands)]
	clear(out)
	for t, k := range kinds {
		wt := w[t]
		switch k {
		case kindActive:
			for i := range cands {
				out[i] += wt * float64(cands[i].Active)
			}
		case kindQueue:
			for i := range cands {
				ti := &tele[i]
				out[i] += wt * (ti.qc*ti.q + (1-ti.qc)*qNeutral)
			}
		case kindLatency:
			for i := range cands {
				var v float64
				switch {
				case ttftOdd:
					v = ttftNorm[i]
				case ttftMax > 0:
					v = tele[i].ttft / ttftMax
				}
				out[i] += wt * v
			}
		case kindJob:
			for i := range cands {
				var v float64
				if jobMax > 0 {
					v = cands[i].JobCost / jobMax
				}
				out[i] += wt * v
			}
		case kindThroughput:
			for i := range cands {
				var v float64
				switch {
				case tpsOdd:
					v = tpsNorm[i]
				case tpsMax > 0:
					v = tele[i].tps / tpsMax
				}
				out[i] += wt * v
			}
		case kindKV:
			for i := range cands {
				ti := &tele[i]
				out[i] += wt * (ti.kvc*ti.kv + (1-ti.kvc)*kvNeutral)
			}
		case kindGPU:
			for i := range cands {
				ti := &tele[i]
				out[i] += wt * (ti.gpuc*ti.gpu + (1-ti.gpuc)*gpuNeutral)
			}
		case kindPrefix:
			for i := range cands {
				out[i] += wt * clamp01(cands[i].PrefixMatch)
			}
		default:
			for i, v := range custom[t] {
				out[i] += wt * v
			}
		}
	}
}

// teleInputs is what pass one of fastTotals reads of a candidate: its
// queue, KV and GPU readings' confidence and scaled value, and its TTFT
// and decode-rate averages. Snapshots and stats are immutable values, so
// what is read of them is kept with the pointer it was read from, in the
// scratch's slot of the candidate, and read again only when the pointer
// changes: from one pick to the next the i-th candidate is mostly the
// same worker with the same telemetry. Only the confidences depend on the
// time, and only past a reading's freshness.
type teleInputs struct {
	qc, q, kvc, kv, gpuc, gpu float64 // confidence and scaled value of each reading
	ttft, tps                 float64 // the averages' values
	ttftKnown, tpsKnown       bool

	// Kept of snap, for staleAfter: whether each reading was made, and
	// until when it is fresh (its confidence 1).
	snap                      *Snapshot
	st                        *stats.WorkerStats
	staleAfter                time.Duration
	qKnown, kvKnown, gpuKnown bool
	qBy, kvBy, gpuBy          time.Time
}

// read fills ti for a candidate with telemetry snap and stats st at env.
// The values are those confidence and scaleReading give, bit for bit.
func (ti *teleInputs) read(env *Env, snap *Snapshot, st *stats.WorkerStats) {
	var staleAfter time.Duration
	if env != nil {
		staleAfter = env.StaleAfter
	}
	if ti.snap != snap || ti.staleAfter != staleAfter {
		ti.snap, ti.staleAfter = snap, staleAfter
		ti.q, ti.qKnown, ti.qBy = scaleReading(readQueue, snap.QueueLen.Value), snap.QueueLen.Known(), snap.QueueLen.At.Add(staleAfter)
		ti.kv, ti.kvKnown, ti.kvBy = scaleReading(readKV, snap.KVPressure.Value), snap.KVPressure.Known(), snap.KVPressure.At.Add(staleAfter)
		ti.gpu, ti.gpuKnown, ti.gpuBy = scaleReading(readGPU, snap.GPUUtil.Value), snap.GPUUtil.Known(), snap.GPUUtil.At.Add(staleAfter)
	}
	if ti.st != st {
		ti.st = st
		ti.ttft, ti.ttftKnown = st.TTFTMs.Value, st.TTFTMs.Known()
		ti.tps, ti.tpsKnown = st.DecodeTPS.Value, st.DecodeTPS.Known()
	}
	if staleAfter <= 0 { // nothing goes stale: a reading made counts in full
		ti.qc, ti.kvc, ti.gpuc = known01(ti.qKnown), known01(ti.kvKnown), known01(ti.gpuKnown)
		return
	}
	ti.qc = freshConfidence(env, &snap.QueueLen, ti.qKnown, ti.qBy)
	ti.kvc = freshConfidence(env, &snap.KVPressure, ti.kvKnown, ti.kvBy)
	ti.gpuc = freshConfidence(env, &snap.GPUUtil, ti.gpuKnown, ti.gpuBy)
}

// known01 is the confidence of a reading that never goes stale: 1 when
// it was made, else 0.
func known01(known bool) float64 {
	if known {
		return 1
	}
	return 0
}

// freshConfidence is confidence(env, r) for a reading known or not and
// fresh until by (its time plus StaleAfter): 1 without asking the time's
// age while it is fresh, which is when now is not after by.
func freshConfidence(env *Env, r *Reading, known bool, by time.Time) float64 {
	switch {
	case !known:
		return 0
	case env == nil || env.StaleAfter <= 0 || !env.Now.After(by):
		return 1
	}
	return confidence(env, r)
}

// ratioNorms returns scratch space for n normalised values of ratio term
// e (0 latency, 1 throughput).
func (sc *scratch) ratioNorms(e, n int) []float64 {
	if cap(sc.ratio[e]) < n {
		sc.ratio[e] = make([]float64, n)
	}
	return sc.ratio[e][:n]
}
