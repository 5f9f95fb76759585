package bench

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

// traces is the public traces shipped with the repository (traces/).
const traces = "../../traces"

func TestReadTrace_Azure(t *testing.T) {
	items, err := ReadTrace("testdata/azure_conv.csv", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	want := []Item{
		{At: 0, PromptTokens: 374, OutputTokens: 44, Row: 2},
		{At: 4314579 * time.Microsecond, PromptTokens: 396, OutputTokens: 109, Row: 3},
		{At: 4541877 * time.Microsecond, PromptTokens: 879, OutputTokens: 55, Row: 4},
		{At: 4710427 * time.Microsecond, PromptTokens: 91, OutputTokens: 16, Row: 5},
		{At: 5892655 * time.Microsecond, PromptTokens: 91, OutputTokens: 16, Row: 6},
	}
	if diff := cmp.Diff(want, items); diff != "" {
		t.Fatalf("items (-want +got):\n%s", diff)
	}
}

func TestReadTrace_Options(t *testing.T) {
	base, err := ReadTrace("testdata/azure_conv.csv", TraceOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("offset and limit rebase the window", func(t *testing.T) {
		got, err := ReadTrace("testdata/azure_conv.csv", TraceOptions{Offset: 2, Limit: 2})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Row != 4 || got[1].Row != 5 || got[0].At != 0 || got[1].At != base[3].At-base[2].At {
			t.Fatalf("got %+v", got)
		}
	})
	t.Run("speedup divides offsets", func(t *testing.T) {
		got, err := ReadTrace("testdata/azure_conv.csv", TraceOptions{Speedup: 4})
		if err != nil {
			t.Fatal(err)
		}
		for i := range got {
			if want := base[i].At / 4; got[i].At != want {
				t.Fatalf("item %d at %v, want %v", i, got[i].At, want)
			}
		}
	})
	t.Run("target rate sets the mean rate", func(t *testing.T) {
		got, err := ReadTrace("testdata/azure_conv.csv", TraceOptions{TargetRate: 2})
		if err != nil {
			t.Fatal(err)
		}
		// 4 gaps at 2 req/s span 2 s.
		if span := got[len(got)-1].At; span < 2*time.Second-time.Microsecond || span > 2*time.Second+time.Microsecond {
			t.Fatalf("span %v, want 2s", span)
		}
	})
	t.Run("max duration cuts", func(t *testing.T) {
		got, err := ReadTrace("testdata/azure_conv.csv", TraceOptions{MaxDuration: 4541877 * time.Microsecond})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 3 {
			t.Fatalf("got %d items, want 3 (the cut-off is inclusive)", len(got))
		}
	})
	t.Run("speedup and target rate conflict", func(t *testing.T) {
		if _, err := ReadTrace("testdata/azure_conv.csv", TraceOptions{Speedup: 2, TargetRate: 3}); err == nil {
			t.Fatal("no error")
		}
	})
}

func TestReadTrace_MooncakeJitter(t *testing.T) {
	a, err := ReadTrace("testdata/mooncake.jsonl", TraceOptions{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	b, err := ReadTrace("testdata/mooncake.jsonl", TraceOptions{Seed: 7})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(a, b); diff != "" {
		t.Fatalf("same seed, different load:\n%s", diff)
	}
	c, err := ReadTrace("testdata/mooncake.jsonl", TraceOptions{Seed: 8})
	if err != nil {
		t.Fatal(err)
	}
	if cmp.Equal(a, c) {
		t.Fatal("different seeds gave the same jitter")
	}
	if len(a) != 12 {
		t.Fatalf("got %d items, want 12", len(a))
	}
	distinct := map[time.Duration]bool{}
	byRow := map[int]Item{}
	for i, it := range a {
		distinct[it.At] = true
		byRow[it.Row] = it
		if i > 0 && it.At < a[i-1].At {
			t.Fatalf("not sorted at %d", i)
		}
	}
	if len(distinct) != len(a) {
		t.Fatalf("%d distinct arrival times for %d rows: jitter did not spread the bucket", len(distinct), len(a))
	}
	// Rows 1-10 are at 0 ms and rows 11-12 at 3000 ms; after rebasing to
	// the earliest jittered arrival the later bucket must still be later.
	if got := byRow[1]; got.PromptTokens != 6758 || got.OutputTokens != 500 {
		t.Fatalf("row 1 = %+v", got)
	}
	for row := 1; row <= 10; row++ {
		if byRow[row].At >= byRow[11].At || byRow[row].At >= byRow[12].At {
			t.Fatalf("row %d (%v) not before rows 11-12 (%v, %v)", row, byRow[row].At, byRow[11].At, byRow[12].At)
		}
	}
}

func TestReadTrace_LengthsNeedArrivals(t *testing.T) {
	if _, err := ReadTrace("testdata/sharegpt.csv", TraceOptions{}); err == nil || !strings.Contains(err.Error(), "arrival rate") {
		t.Fatalf("err = %v, want a request for an arrival rate", err)
	}
	items, err := ReadTrace("testdata/sharegpt.csv", TraceOptions{Arrivals: Arrivals{Rate: 10}, Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	if len(items) != 4 || items[0].PromptTokens != 74 || items[0].OutputTokens != 918 || items[0].Row != 2 {
		t.Fatalf("items = %+v", items)
	}
	for i := 1; i < len(items); i++ {
		if items[i].At <= items[i-1].At {
			t.Fatalf("arrivals not increasing: %+v", items)
		}
	}
}

func TestParseTrace_MalformedRowsNameTheLine(t *testing.T) {
	tests := []struct {
		name, file, text, want string
	}{
		{"azure count", "trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,44\n2023-11-16 18:15:47.0,abc,1\n",
			`trace.csv:3: ContextTokens: not a number: "abc"`},
		{"azure time", "trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,374,44\n", "trace.csv:2: TIMESTAMP: not a timestamp"},
		{"azure short row", "trace.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374\n", "trace.csv:2: GeneratedTokens: missing field"},
		{"negative", "t.csv", "num_prefill_tokens,num_decode_tokens\n5,6\n7,-1\n", "t.csv:3: num_decode_tokens: out of range"},
		{"header", "t.csv", "a,b\n1,2\n", "t.csv:1: unrecognised header"},
		{"empty", "t.csv", "", "t.csv: empty trace"},
		{"csv quote", "t.csv", "num_prefill_tokens,num_decode_tokens\n5,6\n\"7,1\n", "t.csv:3:"},
		{"mooncake json", "m.jsonl", "{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 2}\n\n{\"timestamp\": 3000, \"input_length\": \"x\"}\n", "m.jsonl:3: json: cannot unmarshal"},
		{"mooncake missing", "m.jsonl", "{\"timestamp\": 0, \"input_length\": 1}\n", "m.jsonl:1: output_length: missing"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTrace(strings.NewReader(tc.text), tc.file, TraceOptions{Arrivals: Arrivals{Rate: 1}})
			if err == nil || !strings.HasPrefix(err.Error(), tc.want) {
				t.Fatalf("err = %v, want prefix %q", err, tc.want)
			}
		})
	}
}

func TestReadTrace_SharedTraces(t *testing.T) {
	tests := []struct {
		file        string
		rows        int
		first       Item
		minSpan     time.Duration
		needArrival bool
	}{
		{"AzureLLMInferenceTrace_conv.csv", 19366, Item{PromptTokens: 374, OutputTokens: 44, Row: 2}, 3400 * time.Second, false},
		{"mooncake_conversation_trace.jsonl", 12031, Item{}, 3400 * time.Second, false},
		{"sharegpt_8k_filtered_stats_llama2_tokenizer.csv", 30731, Item{PromptTokens: 74, OutputTokens: 918, Row: 2}, 0, true},
		{"arxiv_summarization_stats_llama2_tokenizer_filtered_v2.csv", 28257, Item{PromptTokens: 3772, OutputTokens: 54, Row: 2}, 0, true},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join(traces, tc.file)
			opts := TraceOptions{Seed: 1}
			if tc.needArrival {
				opts.Arrivals = Arrivals{Rate: 5}
			}
			items, err := ReadTrace(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(items) != tc.rows {
				t.Fatalf("%d items, want %d", len(items), tc.rows)
			}
			if first := items[0]; tc.needArrival {
				first.At = 0 // synthetic
				items[0] = first
			}
			if tc.first.Row != 0 && !cmp.Equal(items[0], tc.first) {
				t.Fatalf("first item %+v, want %+v", items[0], tc.first)
			}
			if span := items[len(items)-1].At; span < tc.minSpan {
				t.Fatalf("span %v, want at least %v", span, tc.minSpan)
			}
			// A window and a rate rescale must work on real data too.
			opts.Offset, opts.Limit, opts.TargetRate = 100, 500, 20
			opts.Arrivals = Arrivals{} // length-only traces take TargetRate as their rate
			w, err := ReadTrace(path, opts)
			if err != nil {
				t.Fatal(err)
			}
			if len(w) != 500 {
				t.Fatalf("window has %d items, want 500", len(w))
			}
			if rate := float64(len(w)-1) / w[len(w)-1].At.Seconds(); rate < 15 || rate > 25 {
				t.Fatalf("window rate %.1f req/s, want about 20", rate)
			}
		})
	}
}

func FuzzParseTrace(f *testing.F) {
	for _, name := range []string{"testdata/azure_conv.csv", "testdata/mooncake.jsonl", "testdata/sharegpt.csv"} {
		b, err := os.ReadFile(name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1e3,2.0\n"))
	f.Add([]byte("{\"timestamp\": 1e300, \"input_length\": 1, \"output_length\": 1}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		items, err := ParseTrace(strings.NewReader(string(data)), "fuzz", TraceOptions{Arrivals: Arrivals{Rate: 100}, Limit: 1000})
		if err != nil {
			if !strings.HasPrefix(err.Error(), "fuzz") {
				t.Fatalf("error does not name the file: %v", err)
			}
			return
		}
		for i, it := range items {
			if it.At < 0 || it.PromptTokens < 0 || it.OutputTokens < 0 || it.Row < 1 {
				t.Fatalf("item %d invalid: %+v", i, it)
			}
			if i > 0 && it.At < items[i-1].At {
				t.Fatalf("items not sorted at %d", i)
			}
		}
	})
}

func TestReadTrace_MooncakeHashIDsArePrefix(t *testing.T) {
	items, err := ParseTrace(strings.NewReader(
		"{\"timestamp\": 0, \"input_length\": 1100, \"output_length\": 5, \"hash_ids\": [0, 1, 2]}\n"+
			"{\"timestamp\": 3000, \"input_length\": 600, \"output_length\": 5}\n"), "m.jsonl", TraceOptions{Format: FormatMooncake})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(items[0].Prefix, []uint64{0, 1, 2}); diff != "" || items[0].PrefixBlockTokens != MooncakeBlockTokens {
		t.Errorf("row with hash_ids: prefix %v in blocks of %d; want [0 1 2] in blocks of %d", items[0].Prefix, items[0].PrefixBlockTokens, MooncakeBlockTokens)
	}
	if items[1].Prefix != nil || items[1].PrefixBlockTokens != 0 {
		t.Errorf("row without hash_ids: prefix %v in blocks of %d; want none", items[1].Prefix, items[1].PrefixBlockTokens)
	}
}
