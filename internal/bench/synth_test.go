package bench

import (
	"math"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSynthesize_PoissonRate(t *testing.T) {
	items, err := Synthesize(Synthetic{Arrivals: Arrivals{Rate: 50}, Duration: 200 * time.Second, Seed: 3})
	if err != nil {
		t.Fatal(err)
	}
	// 10000 expected; Poisson sd is 100, so ±4% is a 4-sigma band.
	if n := len(items); n < 9600 || n > 10400 {
		t.Fatalf("%d arrivals in 200 s at 50/s, want about 10000", n)
	}
	var gaps []float64
	for i, it := range items {
		if it.At >= 200*time.Second || (i > 0 && it.At < items[i-1].At) || it.Row != i+1 {
			t.Fatalf("item %d = %+v", i, it)
		}
		if i > 0 {
			gaps = append(gaps, (it.At - items[i-1].At).Seconds())
		}
		if it.OutputTokens < 10 || it.OutputTokens > 2000 || it.PromptTokens < 16 || it.PromptTokens > 8000 {
			t.Fatalf("item %d lengths outside the defaults: %+v", i, it)
		}
	}
	if c := cv(gaps); c < 0.9 || c > 1.1 {
		t.Fatalf("gap CV %.2f, want about 1 for Poisson", c)
	}
}

func TestSynthesize_DeterministicBySeed(t *testing.T) {
	s := Synthetic{Arrivals: Arrivals{Rate: 5, CV: 3}, Count: 200, Seed: 42}
	a, err := Synthesize(s)
	if err != nil {
		t.Fatal(err)
	}
	b, err := Synthesize(s)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("same seed differs:\n%s", diff)
	}
	s.Seed = 43
	c, err := Synthesize(s)
	if err != nil {
		t.Fatal(err)
	}
	if cmp.Equal(a, c) {
		t.Fatal("different seeds gave the same load")
	}
	if len(a) != 200 {
		t.Fatalf("%d items, want Count 200", len(a))
	}
}

func TestArrivals_GammaIsBursty(t *testing.T) {
	times, err := Arrivals{Rate: 20, CV: 3}.Times(20000, 0, 9)
	if err != nil {
		t.Fatal(err)
	}
	var gaps []float64
	for i := 1; i < len(times); i++ {
		gaps = append(gaps, (times[i] - times[i-1]).Seconds())
	}
	if c := cv(gaps); c < 2.5 || c > 3.5 {
		t.Fatalf("gap CV %.2f, want about 3", c)
	}
	if rate := float64(len(times)) / times[len(times)-1].Seconds(); rate < 17 || rate > 23 {
		t.Fatalf("mean rate %.1f, want about 20", rate)
	}
}

func TestArrivals_SpikeAndOnOff(t *testing.T) {
	a := Arrivals{Rate: 10, SpikeAt: 100 * time.Second, SpikeFor: 20 * time.Second, SpikeFactor: 5}
	times, err := a.Times(0, 200*time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	in, before := 0, 0
	for _, at := range times {
		switch {
		case at >= 100*time.Second && at < 120*time.Second:
			in++
		case at < 100*time.Second:
			before++
		}
	}
	// 20 s at 50/s = 1000 (sd 32); 100 s at 10/s = 1000 (sd 32).
	if in < 880 || in > 1120 || before < 880 || before > 1120 {
		t.Fatalf("%d arrivals in the spike, %d before it; want about 1000 each", in, before)
	}

	o := Arrivals{Rate: 10, On: time.Second, Off: 3 * time.Second}
	times, err = o.Times(0, 400*time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	for _, at := range times {
		if at%(4*time.Second) >= time.Second {
			t.Fatalf("arrival at %v falls in an off period", at)
		}
	}
	if n := len(times); n < 3700 || n > 4300 {
		t.Fatalf("%d arrivals, want about 4000 (the mean rate is kept)", n)
	}
}

func TestParseBurst(t *testing.T) {
	got, err := ParseBurst("gamma:2.5, onoff:2s:8s,spike:1m:10s:4", Arrivals{Rate: 3})
	if err != nil {
		t.Fatal(err)
	}
	want := Arrivals{Rate: 3, CV: 2.5, On: 2 * time.Second, Off: 8 * time.Second, SpikeAt: time.Minute, SpikeFor: 10 * time.Second, SpikeFactor: 4}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("(-want +got):\n%s", diff)
	}
	for _, bad := range []string{"gamma", "gamma:x", "onoff:1s", "spike:1s:1s", "storm:3"} {
		if _, err := ParseBurst(bad, Arrivals{Rate: 1}); err == nil {
			t.Errorf("ParseBurst(%q): no error", bad)
		}
	}
}

func TestArrivals_Validate(t *testing.T) {
	for _, a := range []Arrivals{{}, {Rate: -1}, {Rate: math.Inf(1)}, {Rate: 1, CV: -1}, {Rate: 1, On: time.Second}} {
		if err := a.Validate(); err == nil {
			t.Errorf("%+v: no error", a)
		}
	}
	if _, err := (Arrivals{Rate: 1}).Times(0, 0, 1); err == nil {
		t.Error("unbounded Times: no error")
	}
}
