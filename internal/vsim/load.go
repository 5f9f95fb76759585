package vsim

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/sim"
)

// WorkerCapacity estimates how many requests per second a worker sustains
// with every slot busy, for requests of meanPrompt prompt tokens and
// meanOutput output tokens. With S resident sequences (the slot count, or
// fewer when S whole requests do not fit in the KV cache), S requests take
//
//	T = F·(N·(DecodeBase + DecodePerSeq·S) + S·P/PrefillTokensPerSec) / Speed
//
// where N and P are the mean output and prompt lengths and F the mean
// collision factor 1 + InterferenceScale·(S−1)·exp(InterferenceSigma²/2)
// (the mean of the engine's log-normal draw); capacity is S/T. It ignores
// preemption and the ramp-up of a batch, so it is an upper estimate of
// what a perfectly balanced router could get.
func WorkerCapacity(p sim.Params, meanPrompt, meanOutput float64) float64 {
	s := p.Slots
	if fit := int(float64(p.KVTokens) / max(meanPrompt+meanOutput, 1)); fit < s {
		s = max(fit, 1)
	}
	sf := float64(s)
	f := 1.0
	if s > 1 {
		f = 1 + p.InterferenceScale*(sf-1)*math.Exp(p.InterferenceSigma*p.InterferenceSigma/2)
	}
	step := (p.DecodeBase + time.Duration(sf)*p.DecodePerSeq).Seconds()
	t := f * (meanOutput*step + sf*meanPrompt/p.PrefillTokensPerSec) / p.Speed
	return sf / t
}

// Capacity is the sum of WorkerCapacity over workers for the mean prompt
// and output lengths of items, in requests per second.
func Capacity(workers []sim.WorkerSpec, items []bench.Item) float64 {
	if len(items) == 0 {
		return 0
	}
	var p, n float64
	for _, it := range items {
		p += float64(max(it.PromptTokens, 1))
		n += float64(max(it.OutputTokens, 1))
	}
	p /= float64(len(items))
	n /= float64(len(items))
	c := 0.0
	for _, w := range workers {
		c += WorkerCapacity(w.Params, p, n)
	}
	return c
}

// AtRate returns a copy of items with arrivals rescaled so that the mean
// rate, (n−1)/span as bench.TraceOptions.TargetRate defines it, is rate
// requests per second. The first arrival moves to 0. The pauses of items
// that follow another's answer (bench.Item.Pause) are rescaled alike;
// such items arrive once that answer has come, so the rate they make is
// below rate by the time answers take.
func AtRate(items []bench.Item, rate float64) ([]bench.Item, error) {
	if rate <= 0 || math.IsNaN(rate) || math.IsInf(rate, 0) {
		return nil, fmt.Errorf("vsim: rate %v is not a positive number", rate)
	}
	out := slices.Clone(items)
	if len(out) < 2 {
		for i := range out {
			out[i].At = 0
		}
		return out, nil
	}
	slices.SortStableFunc(out, func(a, b bench.Item) int { return cmp.Compare(a.At, b.At) })
	first, span := out[0].At, out[len(out)-1].At-out[0].At
	if span <= 0 {
		return nil, errors.New("vsim: every item arrives at the same time; no rate to rescale")
	}
	want := float64(len(out)-1) / rate // seconds
	k := want / span.Seconds()
	for i := range out {
		out[i].At = time.Duration(float64(out[i].At-first) * k)
		out[i].Pause = time.Duration(float64(out[i].Pause) * k)
	}
	return out, nil
}

// Burst returns a copy of items (sorted by arrival) in which the arrivals
// that would have come in the factor·length window starting at at are
// squeezed into length, so that for length the rate is factor times the
// base rate; later arrivals move earlier by (factor−1)·length. Every item
// is kept, so the burst's requests are the same trace rows.
func Burst(items []bench.Item, at, length time.Duration, factor float64) []bench.Item {
	out := slices.Clone(items)
	slices.SortStableFunc(out, func(a, b bench.Item) int { return cmp.Compare(a.At, b.At) })
	if factor <= 1 || length <= 0 {
		return out
	}
	wide := time.Duration(float64(length) * factor)
	for i := range out {
		switch t := out[i].At; {
		case t < at:
		case t < at+wide:
			out[i].At = at + time.Duration(float64(t-at)/factor)
		default:
			out[i].At = t - (wide - length)
		}
	}
	return out
}

// FIFOInversions counts requests that waited in the queue and were bound
// more than slack before an earlier arrival that also waited: a Sluice
// queue drains oldest first, so in virtual time this is 0. Arrival is the
// result's Start (the send time), bind time Start + QueueMs; requests
// without a queue wait are skipped. Over HTTP, slack should cover the
// X-Sluice-Queue-Ms header's 1 ms resolution and the time between the
// client's send and the router's admission, both times the time scale.
func FIFOInversions(results []bench.Result, slack time.Duration) int {
	type b struct{ arr, bind time.Duration }
	var q []b
	for _, r := range results {
		if r.QueueMs > 0 && r.OK() {
			q = append(q, b{r.Start, r.Start + time.Duration(r.QueueMs*float64(time.Millisecond))})
		}
	}
	slices.SortStableFunc(q, func(x, y b) int { return cmp.Compare(x.arr, y.arr) })
	n := 0
	latest := time.Duration(math.MinInt64)
	for _, x := range q {
		if x.bind+slack < latest {
			n++
		}
		latest = max(latest, x.bind)
	}
	return n
}
