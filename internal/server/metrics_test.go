package server

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/sim"
)

func TestMetrics_UnknownModelIsNoLabelValue(t *testing.T) {
	r := startRouter(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "gpu0")}, nil))
	for _, body := range []string{
		`{"model":"client-invented-model-1","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"client-invented-model-2","stream":true,"messages":[{"role":"user","content":"hi"}]}`,
	} {
		resp, err := http.Post(r.url+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if readAll(t, resp); resp.StatusCode != http.StatusNotFound {
			t.Fatalf("status %d, want 404", resp.StatusCode)
		}
	}
	resp, err := http.Get(r.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if text := readAll(t, resp); strings.Contains(text, "client-invented") {
		t.Fatalf("/metrics carries a client-supplied model name:\n%s", grepLines(text, "client-invented"))
	}
}

// grepLines returns the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// scrapeFamilies reads /metrics into metric families.
func scrapeFamilies(t *testing.T, url string) map[string]*dto.MetricFamily {
	t.Helper()
	resp, err := http.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

// labelNames returns the sorted label names of a family's first series.
func labelNames(f *dto.MetricFamily) []string {
	var out []string
	for _, l := range f.GetMetric()[0].GetLabel() {
		out = append(out, l.GetName())
	}
	sort.Strings(out)
	return out
}

// TestMetrics_NamesAndLabels checks every metric the README lists, with
// its type and labels, in front of a simulated llama-server with a DCGM
// exporter (so KV and GPU gauges exist) and of two failing workers (so a
// retry is counted).
func TestMetrics_NamesAndLabels(t *testing.T) {
	specs := sim.DemoFleet()[:1]
	specs[0].TimeScale = 50
	specs[0].Params.StartupDelay = 0
	fl, err := sim.StartFleet(context.Background(), specs, "127.0.0.1", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer fl.Close()
	w := fl.Workers()[0]
	<-w.Server.Ready()
	model := specs[0].Params.Model
	cfg := config.DefaultConfig()
	cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter = time.Hour, time.Hour
	cfg.Workers = []config.Worker{{Name: "gpu0", URL: w.URL, Kind: "llamacpp", GPUMetrics: w.URL + "/dcgm/metrics"}}
	r := startRouter(t, cfg)
	r.srv.ScrapeNow(context.Background())
	for _, stream := range []bool{true, false} {
		body := fmt.Sprintf(`{"model":%q,"stream":%v,"max_tokens":8,"ignore_eos":true,"messages":[{"role":"user","content":"hi"}]}`, model, stream)
		if resp := post(t, context.Background(), r.url, body); readAll(t, resp) == "" || resp.StatusCode != 200 {
			t.Fatalf("stream=%v: status %d", stream, resp.StatusCode)
		}
	}
	failing := []*fakeWorker{newFakeWorker(t, "bad0"), newFakeWorker(t, "bad1")}
	for _, f := range failing {
		f.fail.Store(1)
	}
	r2 := startRouter(t, testConfig(t, failing, nil))
	if resp := post(t, context.Background(), r2.url, chat("x", false)); readAll(t, resp) == "" || resp.StatusCode != http.StatusBadGateway {
		t.Fatalf("two failing workers: status %d, want 502", resp.StatusCode)
	}

	want := map[string]struct {
		typ    dto.MetricType
		labels []string
	}{
		"sluice_requests_total":                      {dto.MetricType_COUNTER, []string{"model", "reason", "status", "worker"}},
		"sluice_queue_wait_seconds":                  {dto.MetricType_HISTOGRAM, []string{"model"}},
		"sluice_ttft_seconds":                        {dto.MetricType_HISTOGRAM, []string{"model", "worker"}},
		"sluice_worker_ttft_seconds":                 {dto.MetricType_HISTOGRAM, []string{"model", "worker"}},
		"sluice_request_duration_seconds":            {dto.MetricType_HISTOGRAM, []string{"model", "worker"}},
		"sluice_time_per_output_token_seconds":       {dto.MetricType_HISTOGRAM, []string{"model", "worker"}},
		"sluice_output_tokens_total":                 {dto.MetricType_COUNTER, []string{"model", "worker"}},
		"sluice_prompt_tokens_total":                 {dto.MetricType_COUNTER, []string{"model", "worker"}},
		"sluice_retries_total":                       {dto.MetricType_COUNTER, []string{"model"}},
		"sluice_continuation_gap_seconds":            {dto.MetricType_HISTOGRAM, nil},
		"sluice_queue_depth":                         {dto.MetricType_GAUGE, []string{"model"}},
		"sluice_queue_depth_by_class":                {dto.MetricType_GAUGE, []string{"class", "model"}},
		"sluice_worker_active_requests":              {dto.MetricType_GAUGE, []string{"worker"}},
		"sluice_worker_max_concurrency":              {dto.MetricType_GAUGE, []string{"worker"}},
		"sluice_worker_learned_concurrency":          {dto.MetricType_GAUGE, []string{"worker"}},
		"sluice_worker_concurrency_cap":              {dto.MetricType_GAUGE, []string{"worker"}},
		"sluice_worker_min_stream_tokens_per_second": {dto.MetricType_GAUGE, []string{"worker"}},
		"sluice_worker_eligible":                     {dto.MetricType_GAUGE, []string{"worker"}},
		"sluice_worker_kv_cache_usage_ratio":         {dto.MetricType_GAUGE, []string{"worker"}},
		"sluice_worker_gpu_utilization_ratio":        {dto.MetricType_GAUGE, []string{"worker"}},
		"sluice_worker_ema_ttft_seconds":             {dto.MetricType_GAUGE, []string{"worker"}},
		"sluice_worker_ema_decode_tokens_per_second": {dto.MetricType_GAUGE, []string{"worker"}},
	}
	got := scrapeFamilies(t, r.url)
	for name, f := range scrapeFamilies(t, r2.url) {
		if _, ok := got[name]; !ok {
			got[name] = f
		}
	}
	for name, w := range want {
		f, ok := got[name]
		if !ok {
			t.Errorf("%s: missing from /metrics", name)
			continue
		}
		if f.GetType() != w.typ {
			t.Errorf("%s: type %v, want %v", name, f.GetType(), w.typ)
		}
		if diff := cmp.Diff(w.labels, labelNames(f)); diff != "" {
			t.Errorf("%s labels (-want +got):\n%s", name, diff)
		}
	}
	for name := range got {
		if strings.HasPrefix(name, "sluice_") {
			if _, ok := want[name]; !ok {
				t.Errorf("%s is served but neither tested nor listed", name)
			}
		}
		if strings.HasSuffix(name, "_ms") {
			t.Errorf("%s: not in base units", name)
		}
	}
	// A placed request's series carry the model it asked for.
	reqs := got["sluice_requests_total"]
	if !slices.ContainsFunc(reqs.GetMetric(), func(m *dto.Metric) bool {
		return slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "model" && l.GetValue() == model })
	}) {
		t.Errorf("no sluice_requests_total series has model=%q", model)
	}
	if v := got["sluice_worker_ema_ttft_seconds"].GetMetric()[0].GetGauge().GetValue(); !(v > 0 && v < 60) {
		t.Errorf("sluice_worker_ema_ttft_seconds = %v: not a plausible number of seconds", v)
	}
}
