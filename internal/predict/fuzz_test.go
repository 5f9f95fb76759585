package predict

import (
	"math"
	"testing"
	"time"
)

// FuzzTighten holds Tighten to its promise on any header values: no
// panic, an error or a result, and a result never looser than the base.
func FuzzTighten(f *testing.F) {
	for _, s := range [][2]string{{"800ms", "20"}, {"1500", ""}, {"", "1e308"}, {"-1", "NaN"}, {"1e400", "0x10"}, {"9223372036854775807", "Inf"}} {
		f.Add(s[0], s[1])
	}
	base := SLO{TTFT: 2 * time.Second, TTFTPer1k: 250 * time.Millisecond, MaxTTFT: 10 * time.Second, MinDecode: 15, OnMiss: OnMissServe}
	f.Fuzz(func(t *testing.T, ttft, dec string) {
		h := map[string]string{HeaderTTFTSLO: ttft, HeaderMinDecode: dec}
		got, err := Tighten(base, func(k string) string { return h[k] })
		if err != nil {
			return
		}
		if got.MaxTTFT <= 0 || got.MaxTTFT > base.MaxTTFT {
			t.Fatalf("max TTFT %v from %q, base %v", got.MaxTTFT, ttft, base.MaxTTFT)
		}
		if !(got.MinDecode >= base.MinDecode) || math.IsInf(got.MinDecode, 0) {
			t.Fatalf("min decode %v from %q, base %v", got.MinDecode, dec, base.MinDecode)
		}
		if got.TTFT != base.TTFT || got.TTFTPer1k != base.TTFTPer1k || got.OnMiss != base.OnMiss {
			t.Fatalf("other fields changed: %+v", got)
		}
	})
}
