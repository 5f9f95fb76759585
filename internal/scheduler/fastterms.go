package scheduler

// builtinTotals is totals for the score as the router ships it: the terms
// of DefaultTerms, in their order, with any weights. The general path
// runs each term over every candidate and then adds it in, some twenty
// passes over the candidates, each reading their telemetry and stats
// again, with a call per term. This makes two passes: one gathers what
// the terms normalise by (maxima, confidence-weighted means), the other
// computes every term of a candidate and adds it in. Every value is
// computed by the same operations in the same order as the terms' Score
// methods and totals, so the totals are bit for bit the same
// (TestBuiltinTotals). It reports false, computing nothing, for any other
// list of terms.
func builtinTotals(terms []WeightedTerm, env *Env, cands []Candidate, sc *scratch) bool {
	if len(terms) != 8 {
		return false
	}
	_, ok0 := terms[0].Term.(activeRequests)
	_, ok1 := terms[1].Term.(queueLength)
	_, ok2 := terms[2].Term.(latency)
	_, ok3 := terms[3].Term.(jobCost)
	_, ok4 := terms[4].Term.(throughput)
	_, ok5 := terms[5].Term.(kvPressure)
	_, ok6 := terms[6].Term.(gpuUtil)
	_, ok7 := terms[7].Term.(prefixMatch)
	if !(ok0 && ok1 && ok2 && ok3 && ok4 && ok5 && ok6 && ok7) {
		return false
	}
	var w [8]float64
	for t := range terms {
		w[t] = signedWeight(terms[t])
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
	// Pass two: every term of a candidate, added in term order.
	out := sc.total[:len(cands)]
	for i := range cands {
		c, ti := &cands[i], &tele[i]
		var lat, tps, job float64
		switch {
		case ttftOdd:
			lat = ttftNorm[i]
		case ttftMax > 0:
			lat = c.Stats.TTFTMs.Value / ttftMax
		}
		switch {
		case tpsOdd:
			tps = tpsNorm[i]
		case tpsMax > 0:
			tps = c.Stats.DecodeTPS.Value / tpsMax
		}
		if jobMax > 0 {
			job = c.JobCost / jobMax
		}
		total := 0.0
		total += w[0] * float64(c.Active)
		total += w[1] * (ti.qc*ti.q + (1-ti.qc)*qNeutral)
		total += w[2] * lat
		total += w[3] * job
		total += w[4] * tps
		total += w[5] * (ti.kvc*ti.kv + (1-ti.kvc)*kvNeutral)
		total += w[6] * (ti.gpuc*ti.gpu + (1-ti.gpuc)*gpuNeutral)
		total += w[7] * clamp01(c.PrefixMatch)
		out[i] = total
	}
	return true
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
