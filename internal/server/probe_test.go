package server

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// A decision's breakdown is built when someone reads it (the admin view:
// /api/workers, /debug/decisions), never by the probes a load balancer or
// Prometheus sends every few seconds, nor by the proxy's hooks or the
// dashboard's sampler.
func TestProbes_DoNotBuildTheAdminView(t *testing.T) {
	r := startRouter(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "w1"), newFakeWorker(t, "w2")}, nil))
	serve := func(method, path, body string) {
		t.Helper()
		req := httptest.NewRequest(method, path, strings.NewReader(body))
		req.RemoteAddr = "127.0.0.1:40000"
		rec := httptest.NewRecorder()
		r.srv.Handler().ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Fatalf("%s %s: %d %s", method, path, rec.Code, rec.Body)
		}
	}
	for _, probe := range []struct {
		name string
		call func()
	}{
		{"GET /readyz", func() { serve("GET", "/readyz", "") }},
		{"GET /metrics", func() { serve("GET", "/metrics", "") }},
		{"the dashboard's sampler", func() { r.srv.dash.Sample() }},
	} {
		serve("POST", "/v1/chat/completions", chat(probe.name, false))
		d := r.srv.Decisions().Recent(1)[0]
		probe.call()
		if d.Candidates != nil {
			t.Errorf("%s built the breakdown of decision %s (%d candidates): it read the admin view", probe.name, d.ID, len(d.Candidates))
		}
	}
	d := r.srv.Decisions().Recent(1)[0]
	serve("GET", "/api/workers", "")
	if d.Candidates == nil {
		t.Fatal("/api/workers did not build the breakdown: this test cannot see a probe do it")
	}
}
