package predict

import "math"

// tallyBins is the number of 1 % bins a Tally keeps, from 0 to 300 %;
// larger errors share one last bin.
const tallyBins = 300

// Tally counts relative prediction errors, |predicted − actual| / actual,
// in bins of one percentage point since the process started, so a
// median over a whole run (a benchmark, a day of traffic) costs a fixed
// 1.2 KB per worker and measure instead of a slice per request. The
// trust rule looks at the last 32 (the ring); a Tally answers "how good
// were the predictions over this run", the figure a benchmark quotes.
type Tally struct {
	bins [tallyBins + 1]uint32
	n    int
}

// Add counts one relative error e; NaN and negative values are ignored.
func (t *Tally) Add(e float64) {
	if math.IsNaN(e) || e < 0 {
		return
	}
	t.bins[min(int(e*100), tallyBins)]++
	t.n++
}

// N is how many errors the tally holds.
func (t *Tally) N() int { return t.n }

// Merge adds o's counts to t: a fleet's tally from its workers'.
func (t *Tally) Merge(o *Tally) {
	for i, c := range o.bins {
		t.bins[i] += c
	}
	t.n += o.n
}

// Median returns the median error, to within its 1 % bin (3.0 for errors
// past the last bin); 0 when the tally is empty.
func (t *Tally) Median() float64 { return t.Quantile(0.5) }

// Quantile returns the q-quantile (0 < q ≤ 1) of the errors, nearest
// rank, to within its bin.
func (t *Tally) Quantile(q float64) float64 {
	if t.n == 0 {
		return 0
	}
	rank := max(int(math.Ceil(q*float64(t.n))), 1)
	seen := 0
	for i, c := range t.bins {
		seen += int(c)
		if seen >= rank {
			if i == tallyBins {
				return float64(tallyBins) / 100
			}
			// Spread evenly within the bin: the j-th of c reads as
			// i + (j − ½)/c percent, so a bin's only error reads as its
			// middle.
			below := seen - int(c)
			return (float64(i) + (float64(rank-below)-0.5)/float64(c)) / 100
		}
	}
	return float64(tallyBins) / 100
}
