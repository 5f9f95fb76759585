package compare

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/redistest"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/sim"
	"github.com/sluice-router/sluice/internal/vsim"
)

// TestRunCompare_WritesReport runs a small real-HTTP comparison — a few
// synthetic requests, two policies, one load and a burst, the sim fleet at
// a high time scale — and checks that every report file is written.
func TestRunCompare_WritesReport(t *testing.T) {
	out := t.TempDir()
	o := Options{
		Trace: "synthetic", Limit: 12, Seed: 3, Loads: []float64{50},
		Burst: true, BurstAt: 2 * time.Second, BurstFor: 2 * time.Second, BurstFactor: 3,
		Policies:  []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyLeastConnections},
		TimeScale: 20, Out: out, Timeout: 10 * time.Minute,
	}
	compare(t, o)
	for _, f := range []string{
		"summary.md",
		"load-50/report.md", "load-50/ttft_cdf.svg", "load-50/tpot_cdf.svg", "load-50/e2e_cdf.svg", "load-50/decode_rate_cdf.svg",
		"load-50/concurrency_1_sluice.svg", "load-50/concurrency_2_least-connections.svg", "load-50/sluice.csv",
		"burst/report.md", "burst/least-connections.csv",
	} {
		st, err := os.Stat(filepath.Join(out, f))
		if err != nil {
			t.Errorf("missing %s: %v", f, err)
		} else if st.Size() == 0 {
			t.Errorf("%s is empty", f)
		}
	}
	sum, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"real HTTP", "least-connections", "Goals for Sluice", "burst"} {
		if !strings.Contains(string(sum), want) {
			t.Errorf("summary.md does not mention %q:\n%s", want, sum)
		}
	}
}

// TestRunCompare_ThreeReplicasRow runs a small real-HTTP comparison with
// --replicas 3 against a real Redis and checks that the replicas' row and
// its accounting are in the summary: every request sent to a replica in
// turn and bound there, no worker over its cap, nothing left in the
// ledger.
func TestRunCompare_ThreeReplicasRow(t *testing.T) {
	rs := redistest.Start(t, redistest.Options{})
	out := t.TempDir()
	o := Options{
		Trace: "synthetic", Limit: 12, Seed: 3, Loads: []float64{80},
		Policies:  []scheduler.Policy{scheduler.PolicySluice},
		TimeScale: 20, Out: out, Timeout: 10 * time.Minute,
		Replicas: 3, Redis: rs.URL(0),
	}
	compare(t, o)
	for _, f := range []string{"load-80/sluice.csv", "load-80/sluice-x3.csv", "load-80/report.md"} {
		if st, err := os.Stat(filepath.Join(out, f)); err != nil || st.Size() == 0 {
			t.Errorf("missing or empty %s: %v", f, err)
		}
	}
	sum, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"sluice ×3", "3 replicas against one", "| TTFT p99 (ms) |",
		"- r1: sent 4, bound 4, refused 0, records not naming it 0, degraded 0",
		"- r3: sent 4, bound 4, refused 0, records not naming it 0, degraded 0",
		"requests 12, sent by the front 12, bound (retries included) 12; in flight in the shared ledger after the run: 0",
	} {
		if !strings.Contains(string(sum), want) {
			t.Errorf("summary.md lacks %q:\n%s", want, sum)
		}
	}
	if strings.Contains(string(sum), "over a worker's cap") {
		t.Errorf("a worker went over its cap:\n%s", sum)
	}
}

func TestRunCompare_ReplicasNeedRealHTTPAndRedis(t *testing.T) {
	t.Setenv("PATH", t.TempDir()) // no redis-server to start
	for _, c := range []struct {
		name string
		o    Options
		want string
	}{
		{"virtual", Options{Virtual: true, Replicas: 3}, "real HTTP only"},
		{"negative", Options{Replicas: -1}, "--replicas -1"},
		{"redis alone", Options{Replicas: 1, Redis: "redis://127.0.0.1:1/0"}, "--redis is for --replicas above 1"},
		{"no redis", Options{Replicas: 3, Trace: "synthetic", Limit: 4, Loads: []float64{50}, Out: t.TempDir()}, "put redis-server on PATH"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := Run(context.Background(), c.o, os.Stderr)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}

// compare runs o within a minute, its progress logged to a file of the
// test's own, and fails the test if the run fails.
func compare(t *testing.T, o Options) {
	t.Helper()
	logf, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := Run(ctx, o, logf); err != nil {
		t.Fatal(err)
	}
}

// TestRunCompare_GoodputScansLoadsAgainstTheSLO runs a small virtual
// comparison with --goodput: the summary states the SLO and gives each
// policy its goodput, the highest load step at which 95% of requests met
// it. With an SLO no request can meet, no step qualifies.
func TestRunCompare_GoodputScansLoadsAgainstTheSLO(t *testing.T) {
	run := func(slo bench.SLO) string {
		out := t.TempDir()
		compare(t, Options{
			Virtual: true, Trace: "synthetic", Limit: 200, Seed: 3, Loads: []float64{50},
			Policies: []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyLeastConnections},
			Out:      out, SLO: slo, Goodput: true,
		})
		sum, err := os.ReadFile(filepath.Join(out, "summary.md"))
		if err != nil {
			t.Fatal(err)
		}
		return string(sum)
	}
	sum := run(bench.DefaultSLO)
	for _, want := range []string{"## Goodput", bench.DefaultSLO.String(), "| sluice | ", "| least-connections | "} {
		if !strings.Contains(sum, want) {
			t.Fatalf("summary.md lacks %q:\n%s", want, sum)
		}
	}
	if strings.Contains(sum, "| sluice | 0% |") {
		t.Fatalf("Sluice met the default SLO at no load:\n%s", sum)
	}
	if sum := run(bench.SLO{TTFT: time.Nanosecond}); !strings.Contains(sum, "| sluice | 0% |") || !strings.Contains(sum, "| least-connections | 0% |") {
		t.Fatalf("with an SLO nobody meets, a goodput above 0:\n%s", sum)
	}
}

// The idle floor bounds every request: on the mixed-speed demo fleet at
// 80% load, no request under Sluice or least-connections gets its first
// token sooner than it does alone on a copy of the fastest card; and the
// summary states the floor and judges the p99 goal against it.
func TestRunCompare_IdleFloorBoundsEveryRequest(t *testing.T) {
	o := Options{
		Virtual: true, Trace: "synthetic", Limit: 200, Seed: 3, Loads: []float64{80},
		Policies: []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyLeastConnections},
		SLO:      bench.DefaultSLO, IdleFloor: true,
	}
	items, _, err := LoadItems(o)
	if err != nil {
		t.Fatal(err)
	}
	fleet := sim.DemoFleet()
	capacity := vsim.Capacity(fleet, items)
	logf, err := os.Create(filepath.Join(t.TempDir(), "log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	ctx := context.Background()
	alone, worker, err := idleFloorRun(ctx, o, fleet, items, capacity, logf)
	if err != nil {
		t.Fatal(err)
	}
	if worker != "gpu-0" {
		t.Errorf("copied %s, want gpu-0: the first of the fastest cards, with the most KV", worker)
	}
	floor := map[int]time.Duration{}
	for _, r := range alone {
		if r.Err != "" {
			t.Fatalf("request %d failed alone: %s", r.Index, r.Err)
		}
		floor[r.Index] = r.TTFT
	}
	at80, err := vsim.AtRate(items, 0.8*capacity)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range o.Policies {
		r, err := runPolicy(ctx, o, fleet, p, 1, false, at80, logf)
		res := r.res
		if err != nil {
			t.Fatal(err)
		}
		sooner := 0
		for _, r := range res {
			if r.Err == "" && r.TTFT < floor[r.Index] {
				sooner++
				t.Errorf("%s: request %d had its first token in %v at 80%% load, %v alone", p, r.Index, r.TTFT, floor[r.Index])
			}
		}
		if sooner > 0 {
			break
		}
	}
	o.Out = t.TempDir()
	compare(t, o)
	sum, err := os.ReadFile(filepath.Join(o.Out, "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Idle floor (--idle-floor): the same rows alone on 4 copies of gpu-0", "the idle floor's p99 is"} {
		if !strings.Contains(string(sum), want) {
			t.Errorf("summary.md lacks %q:\n%s", want, sum)
		}
	}
}

// fakeLlamaServer is a worker shaped like llama.cpp's llama-server: its
// /health, /metrics, /props, /slots and /v1/models are the payloads of
// internal/telemetry/testdata, and /v1/chat/completions streams max_tokens
// chunks for the model /v1/models lists. It counts the chat requests it
// answered and refuses any asking for another model.
type fakeLlamaServer struct {
	srv    *httptest.Server
	served atomic.Int64
	wrong  atomic.Int64 // requests for a model it does not serve
}

func newFakeLlamaServer(t *testing.T) *fakeLlamaServer {
	t.Helper()
	read := func(name string) []byte {
		b, err := os.ReadFile(filepath.Join("..", "..", "internal", "telemetry", "testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	files := map[string][]byte{
		"/health": read("llamacpp_health_ok.json"), "/metrics": read("llamacpp_metrics.txt"),
		"/props": read("llamacpp_props.json"), "/slots": read("llamacpp_slots.json"), "/v1/models": read("llamacpp_models.json"),
	}
	f := &fakeLlamaServer{}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if b, ok := files[r.URL.Path]; ok && r.Method == http.MethodGet {
			w.Write(b)
			return
		}
		if r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		var body struct {
			Model     string `json:"model"`
			MaxTokens int    `json:"max_tokens"`
		}
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil || body.Model != "llama-3.1-8b-instruct" {
			f.wrong.Add(1)
			http.Error(w, `{"error":{"code":400,"message":"model not found","type":"invalid_request_error"}}`, http.StatusBadRequest)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range body.MaxTokens {
			fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"t%d \"}}]}\n\n", i)
			w.(http.Flusher).Flush()
		}
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", body.MaxTokens, body.MaxTokens+10)
		io.WriteString(w, "data: [DONE]\n\n")
		f.served.Add(1)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

// TestRunCompare_RunningWorkers compares two policies on two running
// llama.cpp-shaped workers named with --workers: each request of each
// policy must reach one of them, ask for the model they list, and the
// summary must say it ran on them, on the wall clock, at the capacity
// given.
func TestRunCompare_RunningWorkers(t *testing.T) {
	a, b := newFakeLlamaServer(t), newFakeLlamaServer(t)
	host := strings.TrimPrefix(b.srv.URL, "http://")
	ws := []config.Worker{{Name: "a", URL: a.srv.URL, Kind: "llamacpp"}, {Name: host, URL: b.srv.URL, Kind: "llamacpp"}}
	out := t.TempDir()
	o := Options{
		Trace: "synthetic", Limit: 10, Seed: 3, Loads: []float64{50},
		Policies:  []scheduler.Policy{scheduler.PolicySluice, scheduler.PolicyLeastConnections},
		TimeScale: 1, Out: out, Timeout: time.Minute, Workers: ws, Capacity: 40,
	}
	compare(t, o)
	if n := a.served.Load() + b.served.Load(); n != 20 {
		t.Errorf("the workers answered %d chat requests, want 10 per policy", n)
	}
	if a.served.Load() == 0 || b.served.Load() == 0 {
		t.Errorf("a answered %d, b %d: want both used", a.served.Load(), b.served.Load())
	}
	if n := a.wrong.Load() + b.wrong.Load(); n != 0 {
		t.Errorf("%d requests asked for a model the workers do not list", n)
	}
	sum, err := os.ReadFile(filepath.Join(out, "summary.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"real HTTP against running workers (wall-clock time: time scale 1)",
		"running workers a " + a.srv.URL + " (llamacpp), " + host + " " + b.srv.URL + " (llamacpp)",
		"Fleet capacity: 40.00 req/s (given with --capacity)",
		"50% of capacity (20.00 req/s)",
		"- errors: 0 map[]",
		// Against real workers too, where each limit ended and why.
		"Sluice's concurrency limits at the end of the run",
		"| a | ",
	} {
		if !strings.Contains(string(sum), want) {
			t.Errorf("summary.md lacks %q:\n%s", want, sum)
		}
	}
}

func TestRunCompare_RunningWorkersNeedCapacityAndRealHTTP(t *testing.T) {
	ws := []config.Worker{{Name: "a", URL: "http://127.0.0.1:1", Kind: "llamacpp"}}
	for _, c := range []struct {
		name string
		o    Options
		want string
	}{
		{"no capacity", Options{Workers: ws, Trace: "synthetic", Limit: 4, Loads: []float64{50}, Out: t.TempDir()}, "--workers needs --capacity"},
		{"virtual", Options{Workers: ws, Capacity: 1, Virtual: true}, "--workers is real HTTP only"},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := Run(context.Background(), c.o, os.Stderr)
			if err == nil || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %v, want one saying %q", err, c.want)
			}
		})
	}
}

func TestRunErrors_StatesTheWholeRunFleetWideAndPerWorker(t *testing.T) {
	if got := runErrors([]scheduler.WorkerState{{Name: "a"}}); got != "" {
		t.Errorf("no predictions: %q, want nothing", got)
	}
	var at, ad, bt predict.Tally
	for _, e := range []float64{0.10, 0.12, 0.14} {
		at.Add(e)
		ad.Add(2 * e)
	}
	bt.Add(0.5)
	got := runErrors([]scheduler.WorkerState{
		{Name: "a", Prediction: &scheduler.PredictionState{RunTTFT: at, RunDecode: ad}},
		{Name: "b", Prediction: &scheduler.PredictionState{RunTTFT: bt}},
		{Name: "c", Prediction: &scheduler.PredictionState{}}, // nothing recorded: not listed
	})
	for _, want := range []string{
		"time to first token: 12.5% (p90 50%, 4 requests)", // ranks: 10, 12, 14, 50
		"decode rate: 24.5% (p90 28%, 3 requests)",
		"a 12.5% / 24.5%, b 50.5% / -.",
	} {
		if !strings.Contains(got, want) {
			t.Errorf("runErrors lacks %q:\n%s", want, got)
		}
	}
	if strings.Contains(got, "c ") {
		t.Errorf("a worker with nothing recorded is listed:\n%s", got)
	}
}
