package scheduler

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
	for i := range cands {
		c, ti := &cands[i], &tele[i]
		snap, st := c.Snap, c.Stats
		ti.qc, ti.q = confidence(env, &snap.QueueLen), scaleReading(readQueue, snap.QueueLen.Value)
		if ti.qc > 0 {
			qSum += ti.qc * ti.q
			qW += ti.qc
		}
		ti.kvc, ti.kv = confidence(env, &snap.KVPressure), scaleReading(readKV, snap.KVPressure.Value)
		if ti.kvc > 0 {
			kvSum += ti.kvc * ti.kv
			kvW += ti.kvc
		}
		ti.gpuc, ti.gpu = confidence(env, &snap.GPUUtil), scaleReading(readGPU, snap.GPUUtil.Value)
		if ti.gpuc > 0 {
			gpuSum += ti.gpuc * ti.gpu
			gpuW += ti.gpuc
		}
		if e := &st.TTFTMs; e.Known() {
			ttftMax = max(ttftMax, e.Value)
			ttftOdd = ttftOdd || e.Value < 0
		} else {
			ttftOdd = true
		}
		if e := &st.DecodeTPS; e.Known() {
			tpsMax = max(tpsMax, e.Value)
			tpsOdd = tpsOdd || e.Value < 0
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
					v = cands[i].Stats.TTFTMs.Value / ttftMax
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
					v = cands[i].Stats.DecodeTPS.Value / tpsMax
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

// teleInputs is what pass one of builtinTotals keeps of a candidate's
// queue, KV and GPU readings: each one's confidence and scaled value.
type teleInputs struct {
	qc, q, kvc, kv, gpuc, gpu float64
}

// ratioNorms returns scratch space for n normalised values of ratio term
// e (0 latency, 1 throughput).
func (sc *scratch) ratioNorms(e, n int) []float64 {
	if cap(sc.ratio[e]) < n {
		sc.ratio[e] = make([]float64, n)
	}
	return sc.ratio[e][:n]
}
