package compare

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/vsim"
)

// checkSeeds rejects --seeds where it cannot apply: a spread needs
// Sluice and least-connections, and a cheap run of each (virtual time).
func checkSeeds(o Options) error {
	switch {
	case o.Seeds < 0:
		return fmt.Errorf("--seeds %d: want 1 (this seed only) or more", o.Seeds)
	case o.Seeds <= 1:
		return nil
	case !o.Virtual:
		return errors.New("--seeds is virtual only: it runs every load again for each seed")
	case !slices.Contains(o.Policies, scheduler.PolicySluice) || !slices.Contains(o.Policies, scheduler.PolicyLeastConnections):
		return errors.New("--seeds compares Sluice with least-connections: --policies must name both")
	}
	return nil
}

// ratios are Sluice's figures against least-connections' in one run of
// one scenario.
type ratios struct {
	p50, p99, p1 float64 // Sluice's ÷ least-connections'
	attainment   float64 // Sluice's − least-connections', in points
	// On a fleet with a slowing card (its first slowdown): how many
	// seconds Sluice took to route around it and to come back (+Inf:
	// never), and its p99 TTFT while the card was slow ÷
	// least-connections'.
	slowing      bool
	routed, back float64
	slowP99      float64
}

// withSpell adds the slowing card's figures of runs (Sluice's and
// least-connections') to r, when the fleet has a slowdown.
func withSpell(r ratios, fleet []sim.WorkerSpec, runs []bench.NamedRun) ratios {
	sp := spellsOf(fleet)
	if len(sp) == 0 {
		return r
	}
	var s, lc spellRun
	for _, run := range runs {
		switch run.Name {
		case string(scheduler.PolicySluice):
			s = judgeSpell(run, sp[0])
		case string(scheduler.PolicyLeastConnections):
			lc = judgeSpell(run, sp[0])
		}
	}
	r.slowing, r.routed, r.back, r.slowP99 = true, math.Inf(1), math.Inf(1), s.p99During/lc.p99During
	if s.routedOK {
		r.routed = s.routed.Seconds()
	}
	if s.backOK {
		r.back = s.back.Seconds()
	}
	return r
}

func ratiosOf(s, lc bench.Summary) ratios {
	return ratios{
		p50:        s.TTFT.P50 / lc.TTFT.P50,
		p99:        s.TTFT.P99 / lc.TTFT.P99,
		p1:         s.DecodeRate.P1 / lc.DecodeRate.P1,
		attainment: 100 * (s.Attainment - lc.Attainment),
	}
}

// writeSeeds runs the comparison again, Sluice and least-connections
// only, for each of the o.Seeds-1 seeds after o.Seed, each as a run with
// that --seed would (its own load and, unless --capacity, its own
// capacity), and writes how Sluice's ratios to least-connections' spread
// over all o.Seeds seeds, first holding the ratios of the run with o.Seed
// by scenario name.
func writeSeeds(ctx context.Context, md *bytes.Buffer, o Options, fleet []sim.WorkerSpec, first map[string]ratios, logw *os.File) error {
	names := make([]string, 0, len(first))
	all := map[string][]ratios{}
	for seed := o.Seed; seed < o.Seed+uint64(o.Seeds); seed++ {
		so := o
		so.Seed = seed
		items, _, err := LoadItems(so)
		if err != nil {
			return fmt.Errorf("seed %d: %w", seed, err)
		}
		capacity := so.Capacity
		if capacity <= 0 {
			capacity = vsim.Capacity(fleet, items)
		}
		scens, err := scenarios(so, items, capacity)
		if err != nil {
			return fmt.Errorf("seed %d: %w", seed, err)
		}
		for _, sc := range scens {
			if seed == o.Seed {
				names = append(names, sc.name)
				all[sc.name] = append(all[sc.name], first[sc.name])
				continue
			}
			var sum [2]bench.Summary
			var runs []bench.NamedRun
			for i, p := range []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyLeastConnections} {
				fmt.Fprintf(logw, "seed %d: %s: %s (%d requests)\n", seed, sc.name, p, len(sc.items))
				r, err := runPolicy(ctx, so, fleet, p, 1, false, sc.items, logw)
				if err != nil {
					return fmt.Errorf("seed %d, %s, policy %s: %w", seed, sc.name, p, err)
				}
				runs = append(runs, bench.NamedRun{Name: string(p), Results: r.res, SLO: o.SLO})
				sum[i] = runs[i].Summary()
			}
			all[sc.name] = append(all[sc.name], withSpell(ratiosOf(sum[0], sum[1]), fleet, runs))
		}
	}
	fmt.Fprintf(md, "## Across seeds %d–%d\n\n", o.Seed, o.Seed+uint64(o.Seeds)-1)
	fmt.Fprintf(md, "Each load run again as `--seed S` would run it (its own arrivals and synthetic lengths; a trace with its own arrival times is the same for every seed), Sluice against least-connections: min–max (median) over the %d seeds. One seed at a load near the fleet's ceiling can move a tail by a factor of two, so a goal judged on one seed is judged here too.\n\n", o.Seeds)
	slowing := len(spellsOf(fleet)) > 0
	fmt.Fprintf(md, "| load | p50 TTFT ÷ least-conn. | p99 TTFT ÷ least-conn. | p1 decode ÷ least-conn. | SLO attainment − least-conn. (points) |")
	if slowing {
		fmt.Fprintf(md, " slowing card: routed around (s) | back (s) | p99 TTFT while slow ÷ least-conn. |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n")
	} else {
		fmt.Fprintf(md, "\n| --- | --- | --- | --- | --- |\n")
	}
	for _, name := range names {
		rs := all[name]
		col := func(get func(ratios) float64, format string) string {
			v := make([]float64, len(rs))
			for i, r := range rs {
				v[i] = get(r)
			}
			slices.Sort(v)
			med := v[len(v)/2]
			if len(v)%2 == 0 {
				med = (v[len(v)/2-1] + v[len(v)/2]) / 2
			}
			return fmt.Sprintf(format+"–"+format+" ("+format+")", v[0], v[len(v)-1], med)
		}
		label := strings.TrimPrefix(name, "load-") + "%"
		if name == "burst" {
			label = name
		}
		fmt.Fprintf(md, "| %s | %s | %s | %s | %s |", label,
			col(func(r ratios) float64 { return r.p50 }, "%.2f"),
			col(func(r ratios) float64 { return r.p99 }, "%.2f"),
			col(func(r ratios) float64 { return r.p1 }, "%.2f"),
			col(func(r ratios) float64 { return r.attainment }, "%+.1f"))
		if slowing {
			never := func(s string) string { return strings.ReplaceAll(s, "+Inf", "never") }
			fmt.Fprintf(md, " %s | %s | %s |",
				never(col(func(r ratios) float64 { return r.routed }, "%.0f")),
				never(col(func(r ratios) float64 { return r.back }, "%.0f")),
				col(func(r ratios) float64 { return r.slowP99 }, "%.2f"))
		}
		fmt.Fprintln(md)
	}
	fmt.Fprintln(md)
	return nil
}

// summaryOf is the summary of policy p's run among runs (checkSeeds made
// sure it is there).
func summaryOf(runs []bench.NamedRun, p scheduler.Policy) bench.Summary {
	for _, r := range runs {
		if r.Name == string(p) {
			return r.Summary()
		}
	}
	return bench.Summary{}
}
