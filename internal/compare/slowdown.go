package compare

import (
	"bytes"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/vsim"
)

// A card that slows down mid-run (a fleet file's slowdowns: a thermal
// throttle, a noisy neighbour) is where a router should earn its keep:
// it should notice within seconds, send the card less while it is slow,
// and send it its share again once it recovers. For each slowdown of the
// fleet, writeSlowdowns reports where each policy sent its requests
// before, during and after it, and how their first tokens fared.
//
// Where a request went is counted when it was sent (its arrival plus its
// wait in the router's queue), by windows of slowWindow. Its share of
// the requests sent before the slowdown (the spell's own length before
// it, at most) is what the card got while well; the share it would get
// if every card were sent in proportion to its speed, the slowed card at
// speed·factor and the rest as before, is what it deserves while slow.
// Halfway between the two is the threshold:
//
//   - routed around: the first whole second from the slowdown's start
//     from which the card's share stays at or below the threshold, both
//     over the next slowWindow and over the rest of the slowdown;
//   - back: the first whole second from its end from which the share
//     stays at or above the threshold the same way, over the spell's own
//     length after it (at most the end of the run).
//
// Both need a window that is not noise alone: with a handful of requests
// per window a single window can cross the threshold by chance, which is
// why the rest of the spell must agree.

// slowWindow is the width of the windows the card's share is counted in.
const slowWindow = 5 * time.Second

// Goals for Sluice on a slowing card.
const (
	slowRouteGoal  = 5 * time.Second  // routed around within this of the start
	slowReturnGoal = 30 * time.Second // back within this of the end
	slowP99Goal    = 0.5              // p99 TTFT over the spell against least-connections'
)

// spell is one slowdown of one card, in the run's offsets (from the
// first request's send time).
type spell struct {
	worker   string
	from, to time.Duration
	factor   float64
	speed    float64 // the card's own speed
	share    float64 // the card's share of the fleet's speed when well
}

// spellsOf lists the fleet's slowdowns with an end, in the offsets of
// the run's requests: a run starts once every worker has loaded, and a
// slowdown counts from the worker's creation.
func spellsOf(fleet []sim.WorkerSpec) []spell {
	var ready time.Duration
	total := 0.0
	for _, w := range fleet {
		ready = max(ready, w.Params.StartupDelay)
		total += w.Params.Speed
	}
	var out []spell
	for _, w := range fleet {
		for _, sd := range w.Params.Slowdowns {
			if sd.For <= 0 || sd.Factor >= 1 {
				continue
			}
			out = append(out, spell{worker: w.Name, from: sd.After - ready, to: sd.After + sd.For - ready,
				factor: sd.Factor, speed: w.Params.Speed, share: w.Params.Speed / total})
		}
	}
	return out
}

// sent is one request as the slowdown report counts it.
type sent struct {
	at   time.Duration // when the router sent it
	card bool          // to the slowed card
}

// sentOf returns the requests a worker took, by the time they were sent.
func sentOf(res []bench.Result, worker string) []sent {
	var out []sent
	for _, r := range res {
		if r.Worker == "" {
			continue
		}
		at := r.Start
		if r.QueueMs > 0 {
			at += time.Duration(r.QueueMs * float64(time.Millisecond))
		}
		out = append(out, sent{at: at, card: r.Worker == worker})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

// shareIn returns the card's requests and all requests sent in [a, b).
func shareIn(s []sent, a, b time.Duration) (k, n int) {
	i := sort.Search(len(s), func(i int) bool { return s[i].at >= a })
	for ; i < len(s) && s[i].at < b; i++ {
		n++
		if s[i].card {
			k++
		}
	}
	return k, n
}

func frac(k, n int) float64 {
	if n == 0 {
		return math.NaN()
	}
	return float64(k) / float64(n)
}

// spellRun is one policy's run judged against one spell.
type spellRun struct {
	name                  string
	before, during, after float64 // the card's share of requests sent
	routed, back          time.Duration
	routedOK, backOK      bool
	p99During             float64 // ms, of requests arriving during the spell
	s                     []sent
}

// judgeSpell measures one run against sp; end is the run's last send.
func judgeSpell(r bench.NamedRun, sp spell) spellRun {
	s := sentOf(r.Results, sp.worker)
	out := spellRun{name: r.Name, s: s}
	span := sp.to - sp.from
	end := time.Duration(0)
	if len(s) > 0 {
		end = s[len(s)-1].at
	}
	out.before = frac(shareIn(s, max(sp.from-span, 0), sp.from))
	out.during = frac(shareIn(s, sp.from, sp.to))
	afterEnd := min(sp.to+span, end)
	out.after = frac(shareIn(s, sp.to, afterEnd))
	th := threshold(out.before, sp)
	for t := sp.from; t < sp.to; t += time.Second {
		if frac(shareIn(s, t, t+slowWindow)) <= th && frac(shareIn(s, t, sp.to)) <= th {
			out.routed, out.routedOK = t-sp.from, true
			break
		}
	}
	for t := sp.to; t < afterEnd; t += time.Second {
		if frac(shareIn(s, t, t+slowWindow)) >= th && frac(shareIn(s, t, afterEnd)) >= th {
			out.back, out.backOK = t-sp.to, true
			break
		}
	}
	var ttft []float64
	for _, x := range r.Results {
		if x.Start >= sp.from && x.Start < sp.to && x.Kind == bench.KindOK {
			ttft = append(ttft, float64(x.TTFT)/float64(time.Millisecond))
		}
	}
	out.p99During = quantile(ttft, 0.99)
	return out
}

// threshold is halfway between the card's share while well (before, as
// measured) and the share it would have in proportion to its speed
// while slowed.
func threshold(before float64, sp spell) float64 {
	b := before
	if math.IsNaN(b) {
		b = sp.share
	}
	slow := b * sp.factor / (b*sp.factor + 1 - b)
	return (b + slow) / 2
}

// quantile is the q-quantile of xs by the nearest rank, NaN when empty.
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[min(max(i, 0), len(xs)-1)]
}

// writeSlowdowns writes the slowdown report of one scenario's runs, for
// every slowdown of the fleet; nothing when it has none.
// In virtual time, with Sluice among the runs, it adds what Sluice's
// decisions saw of the card (recordSpell).
func writeSlowdowns(md *bytes.Buffer, o Options, fleet []sim.WorkerSpec, runs []bench.NamedRun, items []bench.Item) error {
	for _, sp := range spellsOf(fleet) {
		writeSpell(md, sp, runs, o.Virtual)
		if !o.Virtual || !slices.ContainsFunc(runs, func(r bench.NamedRun) bool { return r.Name == string(scheduler.PolicySluice) }) {
			continue
		}
		st, err := recordSpell(o, fleet, items, sp)
		if err != nil {
			return fmt.Errorf("slowing card: %w", err)
		}
		writeSpellTerms(md, st, sp)
	}
	return nil
}

func writeSpell(md *bytes.Buffer, sp spell, runs []bench.NamedRun, virtual bool) {
	var js []spellRun
	for _, r := range runs {
		js = append(js, judgeSpell(r, sp))
	}
	if len(js) == 0 {
		return
	}
	fmt.Fprintf(md, "### The slowing card: %s at ×%g speed from %v to %v of the run\n\n", sp.worker, sp.factor, sp.from, sp.to)
	fmt.Fprintf(md, "The card's share of the requests sent (when the router sent them), before it slowed (the %v before), while slow, and after (the %v after); "+
		"the threshold is halfway between its share before and the share it would have in proportion to its speed while slow. "+
		"Routed around: seconds from the start until its share stays at or below the threshold over the next %v and the rest of the slowdown; "+
		"back: seconds from the end until it stays at or above it over the next %v and the %v after.\n\n",
		sp.to-sp.from, sp.to-sp.from, slowWindow, slowWindow, sp.to-sp.from)
	if !virtual {
		fmt.Fprintf(md, "Over HTTP the run's first request leaves once the routers are up, a little after the workers have loaded, while the slowdown counts from the workers' start: the windows are placed as if the run began when the last worker had loaded, so the windows start a little after the card really slows and recovers.\n\n")
	}
	fmt.Fprintf(md, "| policy | share before | while slow | after | threshold | routed around | back | TTFT p99 while slow (ms) | run TTFT p50 / p99 (ms) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	for i, j := range js {
		sum := runs[i].Summary()
		fmt.Fprintf(md, "| %s | %s | %s | %s | %s | %s | %s | %.0f | %.0f / %.0f |\n", j.name, share(j.before), share(j.during), share(j.after),
			share(threshold(j.before, sp)), secs(j.routed, j.routedOK), secs(j.back, j.backOK), j.p99During, sum.TTFT.P50, sum.TTFT.P99)
	}
	fmt.Fprintln(md)
	byName := map[string]spellRun{}
	for _, j := range js {
		byName[j.name] = j
	}
	s, ok := byName[string(scheduler.PolicySluice)]
	lc, ok2 := byName[string(scheduler.PolicyLeastConnections)]
	if ok {
		fmt.Fprintf(md, "Goals for Sluice on the slowing card:\n\n")
		fmt.Fprintf(md, "- routed around within %v of the start: %s — %s\n", slowRouteGoal, secs(s.routed, s.routedOK), verdictOf(s.routedOK && s.routed <= slowRouteGoal))
		fmt.Fprintf(md, "- back within %v of the end: %s — %s\n", slowReturnGoal, secs(s.back, s.backOK), verdictOf(s.backOK && s.back <= slowReturnGoal))
		if ok2 {
			r := s.p99During / lc.p99During
			fmt.Fprintf(md, "- p99 TTFT of the requests arriving while it is slow %.0f ms vs least-connections %.0f ms: ratio %.2f (goal ≤ %g) — %s\n", s.p99During, lc.p99During, r, slowP99Goal, verdictOf(r <= slowP99Goal))
		}
		fmt.Fprintln(md)
	}
	// The share window by window, from one spell's length before to one after.
	span := sp.to - sp.from
	fmt.Fprintf(md, "The card's requests / all requests sent, by %v window (offsets from the start of the slowdown):\n\n```\n%8s", slowWindow, "window")
	for _, j := range js {
		fmt.Fprintf(md, " %18s", j.name)
	}
	fmt.Fprintln(md)
	for t := max(sp.from-span/2, 0); t < sp.to+span; t += slowWindow {
		mark := " "
		if t >= sp.from && t < sp.to {
			mark = "*"
		}
		fmt.Fprintf(md, "%7s%s", fmt.Sprintf("%+.0fs", (t-sp.from).Seconds()), mark)
		for _, j := range js {
			k, n := shareIn(j.s, t, t+slowWindow)
			fmt.Fprintf(md, " %18s", fmt.Sprintf("%d/%d %s", k, n, share(frac(k, n))))
		}
		fmt.Fprintln(md)
	}
	fmt.Fprintf(md, "```\n\n(* the card is slow)\n\n")
}

func share(f float64) string {
	if math.IsNaN(f) {
		return "-"
	}
	return fmt.Sprintf("%.0f%%", 100*f)
}

func secs(d time.Duration, ok bool) string {
	if !ok {
		return "never"
	}
	return fmt.Sprintf("%.0f s", d.Seconds())
}

func verdictOf(met bool) string {
	if met {
		return "met"
	}
	return "**not met**"
}

// How Sluice saw the card slow: its decision records replayed (the same
// virtual run again, deterministic by seed, with a recorder), each score
// term of the slowed card against the mean of the other eligible cards',
// averaged over the decisions before, during and after the slowdown, and
// how often the card was not eligible at all (its learned limit, the
// KV-fit rule) — which of the router's inputs moved, and by how much.

// termGap accumulates one term's values over the decisions of a phase.
type termGap struct {
	raw, gap [3]float64 // the card's raw value; its weighted value minus the others' mean
	n        [3]int
}

// phaseOf is 0 before the spell, 1 during, 2 within one spell's length
// after, -1 otherwise.
func phaseOf(at time.Duration, sp spell) int {
	span := sp.to - sp.from
	switch {
	case at >= sp.from-span && at < sp.from:
		return 0
	case at >= sp.from && at < sp.to:
		return 1
	case at >= sp.to && at < sp.to+span:
		return 2
	}
	return -1
}

// spellTerms is what the records of a Sluice run say of the slowed card.
type spellTerms struct {
	order      []string
	terms      map[string]*termGap
	decisions  [3]int
	ineligible [3]int
	why        [3]map[string]int
}

// recordSpell reruns Sluice's virtual run of items with a recorder and
// gathers what its decisions saw of sp's card.
func recordSpell(o Options, fleet []sim.WorkerSpec, items []bench.Item, sp spell) (*spellTerms, error) {
	var ready time.Duration
	for _, w := range fleet {
		ready = max(ready, w.Params.StartupDelay)
	}
	st := &spellTerms{terms: map[string]*termGap{}}
	for i := range st.why {
		st.why[i] = map[string]int{}
	}
	cfg := vsim.DefaultConfig(fleet)
	if o.Router != nil {
		cfg = vsim.FromRouterConfig(*o.Router, fleet)
	}
	cfg.Policy, cfg.Seed, cfg.MaxConcurrency = scheduler.PolicySluice, o.Seed, o.MaxConcurrency
	cfg.Recorder = func(rec *decisions.Record) {
		ph := phaseOf(rec.Time.Sub(vsim.Epoch)-ready, sp)
		if ph < 0 || rec.Outcome != "bound" {
			return
		}
		rec.Explain()
		st.add(rec, sp.worker, ph)
	}
	_, err := vsim.Run(cfg, items)
	return st, err
}

func (st *spellTerms) add(rec *decisions.Record, worker string, ph int) {
	var card *decisions.Candidate
	for i := range rec.Candidates {
		if rec.Candidates[i].Worker == worker {
			card = &rec.Candidates[i]
		}
	}
	if card == nil {
		return
	}
	st.decisions[ph]++
	if !card.Eligible {
		st.ineligible[ph]++
		st.why[ph][card.Why]++
		return
	}
	for ti, t := range card.Terms {
		sum, n := 0.0, 0
		for _, c := range rec.Candidates {
			if c.Worker != worker && c.Eligible && ti < len(c.Terms) {
				sum += c.Terms[ti].Weighted
				n++
			}
		}
		if n == 0 {
			continue
		}
		g := st.terms[t.Name]
		if g == nil {
			g = &termGap{}
			st.terms[t.Name] = g
			st.order = append(st.order, t.Name)
		}
		g.raw[ph] += t.Raw
		g.gap[ph] += t.Weighted - sum/float64(n)
		g.n[ph]++
	}
}

func meanOf(sum float64, n int) float64 {
	if n == 0 {
		return math.NaN()
	}
	return sum / float64(n)
}

// writeSpellTerms writes what Sluice's decisions saw of the slowed card.
func writeSpellTerms(md *bytes.Buffer, st *spellTerms, sp spell) {
	fmt.Fprintf(md, "How Sluice saw %s slow, from its decision records (the same run replayed with a recorder): each score term of the card, its raw value and its weighted value against the mean of the other eligible cards' (positive counts against the card), averaged over the decisions of the %v before, the slowdown and the %v after:\n\n",
		sp.worker, sp.to-sp.from, sp.to-sp.from)
	fmt.Fprintf(md, "| term | raw before | raw while slow | raw after | against the card before | while slow | after |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n")
	moved, most := "", 0.0
	for _, name := range st.order {
		g := st.terms[name]
		var raw, gap [3]float64
		for i := range 3 {
			raw[i], gap[i] = meanOf(g.raw[i], g.n[i]), meanOf(g.gap[i], g.n[i])
		}
		fmt.Fprintf(md, "| %s | %.3g | %.3g | %.3g | %+.2f | %+.2f | %+.2f |\n", name, raw[0], raw[1], raw[2], gap[0], gap[1], gap[2])
		if d := gap[1] - gap[0]; d > most {
			moved, most = name, d
		}
	}
	fmt.Fprintln(md)
	for i, phase := range []string{"before", "while slow", "after"} {
		var whys []string
		for w, n := range st.why[i] {
			whys = append(whys, fmt.Sprintf("%s ×%d", w, n))
		}
		slices.Sort(whys)
		fmt.Fprintf(md, "- %s: %d decisions, the card not eligible in %d (%s)\n", phase, st.decisions[i], st.ineligible[i], strings.Join(whys, ", "))
	}
	if moved != "" {
		fmt.Fprintf(md, "- the term that moved most against the card while it was slow: %s (%+.2f points against the other cards, from before to during)\n", moved, most)
	}
	fmt.Fprintln(md)
}
