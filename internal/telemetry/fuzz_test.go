package telemetry

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// seed adds every testdata file to f's corpus.
func seed(f *testing.F) {
	f.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", "*"))
	if err != nil {
		f.Fatal(err)
	}
	for _, name := range files {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
}

// checkMetrics holds for any result of a /metrics parser: an error is
// either nothing, a missing list next to a partial result, or malformed
// input; present values are finite and fractions are in 0..1.
// checkMetrics checks a parse's invariants. kvRequired says whether a
// nil error promises KVUsage (llama.cpp's is optional: current builds
// export none).
func checkMetrics(t *testing.T, m Metrics, err error, kvRequired bool) {
	t.Helper()
	if err != nil && !errors.Is(err, ErrMissing) && !errors.Is(err, ErrMalformed) {
		t.Fatalf("unexpected error kind: %v", err)
	}
	for _, v := range []Value{m.QueueLen, m.Running, m.KVUsage} {
		if v.Present && (!finite(v.V) || v.V < 0) {
			t.Fatalf("%s = %v, want finite and >= 0", v.Metric, v.V)
		}
		if !v.Present && v.V != 0 {
			t.Fatalf("absent %s carries %v", v.Metric, v.V)
		}
	}
	if m.KVUsage.Present && m.KVUsage.V > 1 {
		t.Fatalf("KVUsage = %v, want <= 1", m.KVUsage.V)
	}
	if err == nil && (!m.QueueLen.Present || !m.Running.Present || (kvRequired && !m.KVUsage.Present)) {
		t.Fatalf("nil error with absent values: %+v", m)
	}
}

func FuzzParseLlamaCPP(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseLlamaCPP(bytes.NewReader(b))
		checkMetrics(t, m, err, false)
	})
}

func FuzzParseVLLM(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, model := range []string{"", "meta-llama/Llama-3.1-8B-Instruct"} {
			m, err := ParseVLLM(bytes.NewReader(b), model)
			checkMetrics(t, m, err, true)
			for _, v := range []Value{m.PrefixCache.Queries, m.PrefixCache.Hits, m.PrefixCache.KVTokens} {
				if v.Present && (!finite(v.V) || v.V < 0) {
					t.Fatalf("prefix cache value %+v", v)
				}
			}
		}
	})
}

func FuzzParseDCGM(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, sel := range []Selector{nil, {"gpu": "1"}} {
			g, err := ParseDCGM(bytes.NewReader(b), sel)
			if g.Util.Present && (g.Util.V < 0 || g.Util.V > 1) {
				t.Fatalf("Util = %v, want 0..1", g.Util.V)
			}
			if err == nil && !g.Util.Present {
				t.Fatalf("nil error without Util")
			}
		}
	})
}

func FuzzParseLlamaCPPHealth(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, status := range []int{200, 500, 503} {
			h, err := ParseLlamaCPPHealth(status, bytes.NewReader(b))
			if err != nil && (status != 200 || h.State != StateUnknown) {
				t.Fatalf("status %d: err %v with state %v", status, err, h.State)
			}
			if err == nil && h.State == StateUnknown {
				t.Fatalf("status %d: nil error with unknown state", status)
			}
		}
	})
}

func FuzzParseLlamaCPPProps(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseLlamaCPPProps(bytes.NewReader(b))
		if err == nil && p.TotalSlots <= 0 {
			t.Fatalf("nil error with total_slots %d", p.TotalSlots)
		}
	})
}

func FuzzParseModels(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, parse := range []func([]byte) ([]string, error){
			func(b []byte) ([]string, error) { return ParseOpenAIModels(bytes.NewReader(b)) },
			func(b []byte) ([]string, error) { return ParseLlamaCPPModels(bytes.NewReader(b)) },
		} {
			ids, err := parse(b)
			if err == nil && ids == nil {
				t.Fatal("nil error with nil models")
			}
			seen := map[string]bool{}
			for _, id := range ids {
				if id == "" || seen[id] {
					t.Fatalf("empty or duplicate id in %q", ids)
				}
				seen[id] = true
			}
		}
	})
}

func FuzzParseSGLang(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, model := range []string{"", "meta-llama/Llama-3.1-8B-Instruct"} {
			m, err := ParseSGLang(bytes.NewReader(b), model)
			checkMetrics(t, m, err, true)
		}
	})
}

func FuzzParseTGI(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, budget := range []int{0, 32000} {
			m, err := ParseTGI(bytes.NewReader(b), budget)
			checkMetrics(t, m, err, true)
		}
	})
}

func FuzzParseTRTLLMStats(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := ParseTRTLLMStats(bytes.NewReader(b))
		checkMetrics(t, m, err, true)
	})
}

func FuzzParseEngineJSON(f *testing.F) {
	seed(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		if info, err := ParseTGIInfo(bytes.NewReader(b)); err == nil && info.ModelID == "" {
			t.Fatal("nil error without model_id")
		} else if info.MaxTotalTokens < 0 || info.MaxBatchTotalTokens < 0 {
			t.Fatalf("negative limits: %+v", info)
		}
		if ms, err := ParseOllamaPS(bytes.NewReader(b)); err == nil && ms == nil {
			t.Fatal("nil error with nil models")
		} else {
			for _, m := range ms {
				if m.Name == "" || m.ContextLength < 0 {
					t.Fatalf("bad entry %+v", m)
				}
			}
		}
		if cards, err := ParseModelCards(bytes.NewReader(b)); err == nil && cards == nil {
			t.Fatal("nil error with nil cards")
		} else {
			for _, c := range cards {
				if c.ID == "" || c.MaxModelLen < 0 {
					t.Fatalf("bad card %+v", c)
				}
			}
		}
		if s, err := ParseLlamaCPPSlots(bytes.NewReader(b)); err == nil && (len(s.Slots) == 0 || s.NCtx <= 0) {
			t.Fatalf("nil error with %+v", s)
		} else if s.Busy > len(s.Slots) || s.Busy < 0 {
			t.Fatalf("busy %d of %d slots", s.Busy, len(s.Slots))
		} else if s.Prompts > len(s.Slots) || s.Prompts < 0 {
			t.Fatalf("%d prompts of %d slots", s.Prompts, len(s.Slots))
		}
		for _, status := range []int{200, 503} {
			h, err := ParseOllamaRoot(status, bytes.NewReader(b))
			if err == nil && h.State == StateUnknown {
				t.Fatal("nil error with unknown state")
			}
			if g := ParseTGIHealth(status, bytes.NewReader(b)); g.State == StateUnknown {
				t.Fatal("tgi health unknown")
			}
		}
	})
}
