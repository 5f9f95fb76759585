package scheduler

import "testing"

func TestPrefixSourceCode_RoundTrips(t *testing.T) {
	for i, src := range prefixSources {
		if got := prefixSourceCode(src); got != uint8(i) || prefixSources[got] != src {
			t.Errorf("source %q coded %d, listed at %d", src, got, i)
		}
	}
}
