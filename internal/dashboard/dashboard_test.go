package dashboard

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/snapshot"
	"github.com/sluice-router/sluice/internal/stats"
)

// fakeFleet is a hand-written source of worker states with a settable
// clock.
type fakeFleet struct {
	mu      sync.Mutex
	workers []scheduler.WorkerState
	queues  map[string]int
	now     time.Time
}

func (f *fakeFleet) Workers() []scheduler.WorkerState {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]scheduler.WorkerState(nil), f.workers...)
}

// Gauges is what the scheduler's Gauges reports of the same workers.
func (f *fakeFleet) Gauges() []scheduler.WorkerGauges {
	var out []scheduler.WorkerGauges
	for _, w := range f.Workers() {
		out = append(out, scheduler.WorkerGauges{
			WorkerBrief: scheduler.WorkerBrief{Name: w.Name, Models: w.Models, Health: w.Health, Draining: w.Draining},
			Active:      w.Active, OtherReplicas: w.OtherReplicas, Limit: w.Limit, Snapshot: w.Snapshot,
		})
	}
	return out
}
func (f *fakeFleet) QueueDepths() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.queues {
		out[k] = v
	}
	return out
}
func (f *fakeFleet) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}
func (f *fakeFleet) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

func newFake(n int) *fakeFleet {
	f := &fakeFleet{queues: map[string]int{"m": 0}, now: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)}
	for i := range n {
		f.workers = append(f.workers, scheduler.WorkerState{
			Name: fmt.Sprintf("w%03d", i), Models: []string{"m"}, Health: snapshot.HealthOK, Limit: 4, Active: i % 5,
		})
	}
	return f
}

func newDash(f *fakeFleet, samples int) *Dashboard {
	return New(Options{Workers: f.Workers, Gauges: f.Gauges, QueueDepths: f.QueueDepths, Now: f.Now, Samples: samples,
		Stats: func(string) stats.WorkerStats { return stats.WorkerStats{} }})
}

func TestDashboard_SampleRingIsBounded(t *testing.T) {
	f := newFake(2)
	d := newDash(f, 5)
	for range 8 {
		d.Sample()
		f.advance(time.Second)
	}
	seqs := func(s []Sample) []int64 {
		var out []int64
		for _, x := range s {
			out = append(out, x.Seq)
		}
		return out
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, tc := range []struct {
		since int64
		want  []int64
	}{
		{0, []int64{4, 5, 6, 7, 8}},
		{2, []int64{4, 5, 6, 7, 8}}, // older than the ring: all it has
		{6, []int64{7, 8}},
		{8, nil},
		{99, nil},
	} {
		if diff := cmp.Diff(tc.want, seqs(d.samplesAfterLocked(tc.since))); diff != "" {
			t.Errorf("samples after %d (-want +got):\n%s", tc.since, diff)
		}
	}
}

func TestDashboard_CountsOutcomesPerInterval(t *testing.T) {
	f := newFake(1)
	f.queues["m"] = 3
	d := newDash(f, 10)
	for _, r := range []proxy.Result{
		{Worker: "w000", Status: 200, Tokens: 10},
		{Worker: "w000", Status: 200, Tokens: 5},
		{Status: 429, Reason: "queue_full"},
		{Status: 503, Reason: "queue_timeout"},
		{Status: 503, Reason: "queue_timeout"},
		{Worker: "w000", Status: 502, Reason: "upstream_failed"},
		{Status: 400, Reason: "invalid_request"},
	} {
		d.Observe(r)
	}
	d.Decision(&decisions.Record{ID: "a", Chosen: "w000"})
	d.Decision(&decisions.Record{ID: "b", Outcome: "queue_full"})            // refused: not an admission
	d.Decision(&decisions.Record{ID: "c", Chosen: "w000", QueueWaitMs: 230}) // held in the queue first
	s := d.Sample()
	want := counters{Admitted: 2, Held: 1, OK: 2, Rejected: 1, Unavail: 2, Failed: 1, OutTokens: 15}
	if diff := cmp.Diff(want, s.counters); diff != "" {
		t.Errorf("first interval (-want +got):\n%s", diff)
	}
	if got, want := s.Queued, 3; got != want {
		t.Errorf("queued = %d, want %d", got, want)
	}
	d.Observe(proxy.Result{Worker: "w000", Status: 200, Tokens: 1})
	s = d.Sample()
	if diff := cmp.Diff(counters{OK: 1, OutTokens: 1}, s.counters); diff != "" {
		t.Errorf("second interval counts only what happened since the first (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(counters{Admitted: 2, Held: 1, OK: 3, Rejected: 1, Unavail: 2, Failed: 1, OutTokens: 16}, d.totals); diff != "" {
		t.Errorf("totals (-want +got):\n%s", diff)
	}
}

func TestPercentiles_NearestRank(t *testing.T) {
	seq := func(n int) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(n - i) // reversed: percentiles sorts
		}
		return v
	}
	for _, tc := range []struct {
		name string
		in   []float64
		want *Percentiles
	}{
		{"empty", nil, nil},
		{"one", []float64{7}, &Percentiles{P50: 7, P95: 7, P99: 7, N: 1}},
		{"two", []float64{2, 1}, &Percentiles{P50: 1, P95: 2, P99: 2, N: 2}},
		{"hundred", seq(100), &Percentiles{P50: 50, P95: 95, P99: 99, N: 100}},
		{"thousand", seq(1000), &Percentiles{P50: 500, P95: 950, P99: 990, N: 1000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, percentiles(tc.in)); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
}

func TestDashboard_LatencyPercentilesOverTrailingWindow(t *testing.T) {
	f := newFake(1)
	d := New(Options{Workers: f.Workers, Gauges: f.Gauges, Now: f.Now, LatencyWindow: 10 * time.Second})
	// An old slow request, then three fast ones 11 s later.
	d.Observe(proxy.Result{Worker: "w000", Status: 200, TTFT: 900 * time.Millisecond, WorkerTTFT: 900 * time.Millisecond, E2E: 2 * time.Second, Tokens: 2})
	f.advance(11 * time.Second)
	for _, ttft := range []time.Duration{10, 20, 30} {
		// 100 ms queued, then the worker's ttft, then 9 more tokens 5 ms
		// apart.
		d.Observe(proxy.Result{Worker: "w000", Status: 200, QueueWait: 100 * time.Millisecond,
			TTFT: 100*time.Millisecond + ttft*time.Millisecond, WorkerTTFT: ttft * time.Millisecond,
			E2E: 100*time.Millisecond + ttft*time.Millisecond + 45*time.Millisecond, Tokens: 10})
	}
	d.Observe(proxy.Result{Worker: "w000", Status: 200, E2E: time.Second, Tokens: 10}) // not streamed: no TTFT
	s := d.Sample()
	// The old slow request is 900 ms in both views; the window holds the
	// three fast ones, 100 ms queued each.
	for _, c := range []struct {
		name string
		got  *Percentiles
		want *Percentiles
	}{
		{"TTFT as clients saw it", s.TTFT, &Percentiles{P50: 120, P95: 130, P99: 130, N: 3}},
		{"the workers' share", s.WorkerTTFT, &Percentiles{P50: 20, P95: 30, P99: 30, N: 3}},
	} {
		if diff := cmp.Diff(c.want, c.got); diff != "" {
			t.Errorf("%s: percentiles (-want +got):\n%s", c.name, diff)
		}
	}
	if s.TPOT == nil || s.TPOT.N != 3 || s.TPOT.P50 < 4.99 || s.TPOT.P50 > 5.01 {
		t.Errorf("TPOT = %+v, want 3 requests at 5 ms per token", s.TPOT)
	}
	f.advance(11 * time.Second)
	if s := d.Sample(); s.TTFT != nil || s.WorkerTTFT != nil || s.TPOT != nil {
		t.Errorf("after the window passed: TTFT %+v worker TTFT %+v TPOT %+v, want none", s.TTFT, s.WorkerTTFT, s.TPOT)
	}
}

func TestDashboard_WorkerSeriesFollowMembership(t *testing.T) {
	f := newFake(1)
	d := newDash(f, 4)
	f.workers[0].Active = 1
	d.Sample()
	f.workers[0].Active = 2
	f.workers = append(f.workers, scheduler.WorkerState{Name: "late", Active: 3})
	d.Sample()
	d.mu.Lock()
	if diff := cmp.Diff([]int32{1, 2}, d.activeSeriesLocked("w000", 10)); diff != "" {
		t.Errorf("w000 (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]int32{-1, 3}, d.activeSeriesLocked("late", 10)); diff != "" {
		t.Errorf("a worker added later has no values before it came (-want +got):\n%s", diff)
	}
	d.mu.Unlock()
	f.workers = f.workers[1:] // w000 removed
	for range 5 {
		d.Sample()
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.actives["w000"]; ok {
		t.Errorf("a removed worker's series is still kept")
	}
	if got, want := len(d.activeSeriesLocked("late", 100)), 4; got != want {
		t.Errorf("series length = %d, want the ring's %d", got, want)
	}
}

// TestDashboard_InFlightCountsOtherReplicas: with replicas sharing a
// ledger a worker's limit bounds its requests across all of them, so the
// sample, the chart's series, the fleet sum and the busiest order count
// the other replicas' requests too.
func TestDashboard_InFlightCountsOtherReplicas(t *testing.T) {
	f := newFake(2)
	f.workers[0].Active, f.workers[0].OtherReplicas = 1, 0
	f.workers[1].Active, f.workers[1].OtherReplicas = 0, 3 // busiest, by others' requests
	d := newDash(f, 4)
	if s := d.Sample(); s.Active != 4 {
		t.Errorf("sample's in flight = %d, want 1 here + 3 at other replicas", s.Active)
	}
	d.mu.Lock()
	series := d.activeSeriesLocked("w001", 1)
	d.mu.Unlock()
	if diff := cmp.Diff([]int32{3}, series); diff != "" {
		t.Errorf("w001's series (-want +got):\n%s", diff)
	}
	srv := serve(d)
	defer srv.Close()
	ov := getOverview(t, srv, "sort=busy")
	if ov.Fleet.Active != 4 {
		t.Errorf("fleet in flight = %d, want 4", ov.Fleet.Active)
	}
	if len(ov.Workers) < 2 || ov.Workers[0]["name"] != "w001" || len(ov.Busiest) < 1 || ov.Busiest[0].Name != "w001" {
		t.Errorf("busiest first: cards %v, chart %v; want w001, whose 3 requests come from other replicas", names(ov.Workers), ov.Busiest)
	}
}

func getOverview(t *testing.T, srv *httptest.Server, query string) Overview {
	t.Helper()
	resp, err := http.Get(srv.URL + "/api/overview?" + query)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET /api/overview?%s: %d %s", query, resp.StatusCode, b)
	}
	var ov Overview
	if err := json.NewDecoder(resp.Body).Decode(&ov); err != nil {
		t.Fatal(err)
	}
	return ov
}

func serve(d *Dashboard) *httptest.Server {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", d.Index)
	mux.Handle("GET /dashboard/", d.Assets())
	mux.HandleFunc("GET /api/overview", d.ServeOverview)
	return httptest.NewServer(mux)
}

func names(ws []map[string]any) []string {
	var out []string
	for _, w := range ws {
		out = append(out, w["name"].(string))
	}
	return out
}

func TestOverview_PagesSortsAndFilters(t *testing.T) {
	f := newFake(300)
	f.workers[7].Health = snapshot.HealthDown
	f.workers[9].Draining = true
	f.workers[250].Models = []string{"other-model"}
	d := newDash(f, 10)
	d.Sample()
	srv := serve(d)
	defer srv.Close()

	ov := getOverview(t, srv, "offset=20&limit=3")
	if diff := cmp.Diff([]string{"w020", "w021", "w022"}, names(ov.Workers)); diff != "" {
		t.Errorf("page (-want +got):\n%s", diff)
	}
	if got, want := ov.Page, (Page{Offset: 20, Limit: 3, Total: 300, Sort: "config"}); got != want {
		t.Errorf("page = %+v, want %+v", got, want)
	}
	if got, want := ov.Fleet.Workers, 300; got != want {
		t.Errorf("fleet workers = %d, want %d", got, want)
	}
	if got, want := len(ov.Busiest), chartWorkers; got != want {
		t.Errorf("busiest = %d series, want %d", got, want)
	}
	if got := getOverview(t, srv, ""); len(got.Workers) != defaultPageSize {
		t.Errorf("default page has %d workers, want %d", len(got.Workers), defaultPageSize)
	}
	if got := getOverview(t, srv, "offset=299&limit=200"); len(got.Workers) != 1 {
		t.Errorf("last page has %d workers, want 1", len(got.Workers))
	}
	if got := getOverview(t, srv, "offset=5000"); len(got.Workers) != 0 || got.Page.Total != 300 {
		t.Errorf("past the end: %d workers, total %d; want none of 300", len(got.Workers), got.Page.Total)
	}
	if diff := cmp.Diff([]string{"w007", "w009", "w000"}, names(getOverview(t, srv, "sort=trouble&limit=3").Workers)); diff != "" {
		t.Errorf("trouble first (-want +got):\n%s", diff)
	}
	busy := getOverview(t, srv, "sort=busy&limit=2").Workers
	if busy[0]["active"].(float64) != 4 || busy[1]["active"].(float64) != 4 {
		t.Errorf("busiest first: got %v", names(busy))
	}
	if diff := cmp.Diff([]string{"w250"}, names(getOverview(t, srv, "q=OTHER").Workers)); diff != "" {
		t.Errorf("filter by model (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"w007"}, names(getOverview(t, srv, "q=down").Workers)); diff != "" {
		t.Errorf("filter by health (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"w009"}, names(getOverview(t, srv, "q=draining").Workers)); diff != "" {
		t.Errorf("filter draining (-want +got):\n%s", diff)
	}
}

func TestOverview_CardCarriesTheWorkersFields(t *testing.T) {
	f := newFake(1)
	now := f.now
	f.workers[0] = scheduler.WorkerState{
		Name: "gpu-a", Models: []string{"m"}, Health: snapshot.HealthOK, Active: 2, Limit: 4, JobCost: 120,
		Snapshot: &snapshot.Snapshot{Slots: 4,
			KVPressure: snapshot.Reading{Value: 0.5, Source: "llamacpp kv", At: now.Add(-2 * time.Second)}},
		LastTerms: &decisions.Candidate{Worker: "gpu-a", Eligible: true, Rank: 2, Total: 201.5, Terms: []decisions.Term{
			{Name: "active_requests", Raw: 2, Norm: 2, Weight: 100, Weighted: 200, Source: "sluice"},
			{Name: "throughput", Raw: 40, Norm: 0.5, Weight: -3, Weighted: -1.5},
		}},
		LastScoredAt: now.Add(-time.Second),
	}
	f.queues["m"] = 5
	d := New(Options{Workers: f.Workers, Gauges: f.Gauges, QueueDepths: f.QueueDepths, Now: f.Now,
		Stats: func(string) stats.WorkerStats {
			return stats.WorkerStats{TTFTMs: stats.EMA{Value: 250, N: 8}}
		}})
	srv := serve(d)
	defer srv.Close()
	ov := getOverview(t, srv, "")
	w := ov.Workers[0]
	b, _ := json.Marshal(w)
	for _, want := range []string{
		`"job_cost":120`, `"sluice_queue":5`, `"slots":4`, `"kv":{"age_ms":2000,"source":"llamacpp kv","value":0.5}`,
		`"averages":{"n":8,"ttft_ms":250}`, `"rank":2`, `"total":201.5`, `"age_ms":1000`,
		`{"name":"throughput","norm":0.5,"raw":40,"weight":-3,"weighted":-1.5}`,
	} {
		if !strings.Contains(string(b), want) {
			t.Errorf("card lacks %s:\n%s", want, b)
		}
	}
	for _, bulky := range []string{`"telemetry"`, `"last_terms"`} {
		if strings.Contains(string(b), bulky) {
			t.Errorf("card carries %s, which it summarises:\n%s", bulky, b)
		}
	}
}

func TestOverview_RejectsBadParameters(t *testing.T) {
	d := newDash(newFake(1), 10)
	srv := serve(d)
	defer srv.Close()
	for _, q := range []string{"since=-1", "since=x", "limit=0", "limit=201", "offset=-3", "sort=random", "decisions=201", "decisions=-1"} {
		resp, err := http.Get(srv.URL + "/api/overview?" + q)
		if err != nil {
			t.Fatal(err)
		}
		var body struct {
			Error struct{ Message, Code string }
		}
		json.NewDecoder(resp.Body).Decode(&body)
		resp.Body.Close()
		param := strings.SplitN(q, "=", 2)[0]
		if resp.StatusCode != 400 || body.Error.Code != "invalid_request" || !strings.HasPrefix(body.Error.Message, param) {
			t.Errorf("%s: %d %+v, want 400 invalid_request naming %s", q, resp.StatusCode, body.Error, param)
		}
	}
}

func TestAssets_ServedFromTheBinary(t *testing.T) {
	d := newDash(newFake(1), 10)
	srv := serve(d)
	defer srv.Close()
	for _, tc := range []struct {
		path, ctype, contains string
		status                int
	}{
		{"/", "text/html", `src="/dashboard/app.js"`, 200},
		{"/dashboard/app.js", "text/javascript", "/api/overview", 200},
		{"/dashboard/style.css", "text/css", ".card", 200},
		{"/dashboard/", "application/json", "no dashboard asset", 404},
		{"/dashboard/index.html", "application/json", "no dashboard asset", 404},
		{"/dashboard/missing.js", "text/plain", "not found", 404},
	} {
		resp, err := http.Get(srv.URL + tc.path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.HasPrefix(resp.Header.Get("Content-Type"), tc.ctype) || !strings.Contains(string(b), tc.contains) {
			t.Errorf("GET %s: %d %q, want %d %s containing %q", tc.path, resp.StatusCode, resp.Header.Get("Content-Type"), tc.status, tc.ctype, tc.contains)
		}
	}
}

func BenchmarkOverview_300Workers(b *testing.B) {
	f := newFake(300)
	d := newDash(f, 300)
	for range 300 {
		d.Sample()
	}
	b.ReportAllocs()
	for b.Loop() {
		d.overview(0, 0, defaultPageSize, "busy", sorts["busy"], "")
	}
}

func TestOverview_ListsNewestDecisionsBounded(t *testing.T) {
	f := newFake(1)
	log, err := decisions.NewLog(500, "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 300 {
		r := &decisions.Record{ID: fmt.Sprintf("d-%d", i), Model: "m", Outcome: "bound", Chosen: "w000", Attempt: 1,
			Candidates: []decisions.Candidate{{Worker: "w000", Eligible: true}}}
		if i%3 == 0 {
			r.Outcome, r.Chosen = "queue_full", ""
		}
		log.Add(r)
		if i == 298 { // its request streamed; d-299's is still waiting for a token
			log.AddFirstToken(r, decisions.FirstToken{TTFTMs: 1300, WorkerTTFTMs: 300})
		}
	}
	d := New(Options{Workers: f.Workers, Gauges: f.Gauges, Now: f.Now, Recent: log.Recent})
	srv := serve(d)
	defer srv.Close()
	ids := func(ls []DecisionLine) []string {
		var out []string
		for _, l := range ls {
			out = append(out, l.ID)
		}
		return out
	}
	ov := getOverview(t, srv, "decisions=3")
	if diff := cmp.Diff([]string{"d-299", "d-298", "d-297"}, ids(ov.Decisions)); diff != "" {
		t.Errorf("newest first (-want +got):\n%s", diff)
	}
	if got := ov.Decisions[2]; got.Outcome != "queue_full" || got.Chosen != "" {
		t.Errorf("a refusal reads %+v", got)
	}
	type firstToken struct{ TTFTMs, WorkerTTFTMs float64 }
	var fts []firstToken
	for _, l := range ov.Decisions {
		fts = append(fts, firstToken{l.TTFTMs, l.WorkerTTFTMs})
	}
	if diff := cmp.Diff([]firstToken{{}, {1300, 300}, {}}, fts); diff != "" {
		t.Errorf("first tokens of the listed decisions (-want +got):\n%s", diff)
	}
	if got := len(getOverview(t, srv, "").Decisions); got != defaultDecisions {
		t.Errorf("default list has %d decisions, want %d", got, defaultDecisions)
	}
	if got := len(getOverview(t, srv, "decisions=200").Decisions); got != 200 {
		t.Errorf("decisions=200 lists %d", got)
	}
}
