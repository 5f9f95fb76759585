package server

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/sluice-router/sluice/internal/auth"
	"github.com/sluice-router/sluice/internal/config"
)

func sha(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

// syncBuffer is a log sink tests can read while the router writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func startRouterLog(t *testing.T, cfg config.Config, log *slog.Logger) *router {
	t.Helper()
	srv, err := New(cfg, Options{Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv.Handler())
	r := &router{srv: srv, url: hs.URL, hs: hs}
	t.Cleanup(func() { r.stop(t) })
	return r
}

func do(t *testing.T, method, url, token, body string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	return resp, string(b)
}

const (
	keyAcme  = "sk-acme-0123456789abcdef"
	keyBeta  = "sk-beta-fedcba9876543210"
	keyAdmin = "admin-token-5a5a5a5a"
)

// checkError checks an OpenAI-shaped error answer: status, reason in the
// header and the body's code, a message; 429s also say when to retry.
func checkError(t *testing.T, resp *http.Response, body string, status int, reason string) {
	t.Helper()
	if resp.StatusCode != status {
		t.Fatalf("status %d, want %d; body %s", resp.StatusCode, status, body)
	}
	if got := resp.Header.Get("X-Sluice-Reason"); got != reason {
		t.Errorf("X-Sluice-Reason %q, want %q", got, reason)
	}
	if status == http.StatusTooManyRequests {
		if ra, err := strconv.Atoi(resp.Header.Get("Retry-After")); err != nil || ra < 1 {
			t.Errorf("Retry-After %q, want a positive number of seconds", resp.Header.Get("Retry-After"))
		}
	}
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code != reason || e.Error.Message == "" || e.Error.Type == "" {
		t.Errorf("body %s: want OpenAI error with code %q", body, reason)
	}
}

func keysConfig(t *testing.T, workers []*fakeWorker, edit func(*config.Config)) config.Config {
	return testConfig(t, workers, func(c *config.Config) {
		c.Auth.Keys = []config.APIKey{
			{KeySHA256: sha(keyAcme), Tenant: "acme", Class: "interactive"},
			{KeySHA256: sha(keyBeta), Tenant: "beta", Class: "batch"},
		}
		if edit != nil {
			edit(c)
		}
	})
}

func TestGuard_InferenceNeedsAValidKey(t *testing.T) {
	var seenAuth []string
	var mu sync.Mutex
	w := newFakeWorker(t, "w1")
	inner := w.srv.Config.Handler
	w.srv.Config.Handler = http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			mu.Lock()
			seenAuth = append(seenAuth, r.Header.Get("Authorization"))
			mu.Unlock()
		}
		inner.ServeHTTP(rw, r)
	})
	r := startRouter(t, keysConfig(t, []*fakeWorker{w}, nil))
	for _, tc := range []struct {
		name, token string
		status      int
		reason      string
	}{
		{"no key", "", 401, "invalid_api_key"},
		{"wrong key", "sk-acme-0123456789abcdeX", 401, "invalid_api_key"},
		{"admin-looking garbage", keyAdmin, 401, "invalid_api_key"},
		{"acme", keyAcme, 200, ""},
		{"beta", keyBeta, 200, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, body := do(t, "POST", r.url+"/v1/chat/completions", tc.token, chat(tc.name, false))
			if tc.status != 200 {
				checkError(t, resp, body, tc.status, tc.reason)
				if strings.Contains(body, tc.token) && tc.token != "" {
					t.Errorf("the error echoes the presented key: %s", body)
				}
				return
			}
			if resp.StatusCode != 200 {
				t.Fatalf("status %d: %s", resp.StatusCode, body)
			}
		})
	}
	// GET /v1/models is an inference route too.
	if resp, body := do(t, "GET", r.url+"/v1/models", "", ""); resp.StatusCode != 401 {
		t.Errorf("GET /v1/models without a key: %d %s", resp.StatusCode, body)
	}
	// Probes stay open.
	if resp, _ := do(t, "GET", r.url+"/healthz", "", ""); resp.StatusCode != 200 {
		t.Errorf("/healthz without a key: %d", resp.StatusCode)
	}
	// Refusals are counted (4: three POSTs and the GET /v1/models).
	_, metrics := do(t, "GET", r.url+"/metrics", "", "")
	if want := `sluice_requests_total{model="",reason="invalid_api_key",status="401",worker=""} 4`; !strings.Contains(metrics, want) {
		t.Errorf("metrics lack %s", want)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seenAuth) != 2 {
		t.Fatalf("worker saw %d requests, want the 2 with valid keys", len(seenAuth))
	}
	for _, a := range seenAuth {
		if a != "" {
			t.Errorf("worker received the client's Authorization header %q", a)
		}
	}
}

func TestGuard_IdentityReachesTheHandler(t *testing.T) {
	cfg := keysConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, nil)
	srv, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var got auth.Identity
	var ok bool
	h := srv.guard(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got, ok = auth.FromContext(r.Context())
	}))
	req := httptest.NewRequest("POST", "/v1/chat/completions", strings.NewReader(chat("x", false)))
	req.Header.Set("Authorization", "Bearer "+keyBeta)
	h.ServeHTTP(httptest.NewRecorder(), req)
	if want := (auth.Identity{Tenant: "beta", Class: "batch"}); !ok || got != want {
		t.Fatalf("identity = %+v (%v), want %+v", got, ok, want)
	}
}

func TestGuard_AdminWithoutTokenIsLoopbackOnly(t *testing.T) {
	logs := &syncBuffer{}
	cfg := keysConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, nil)
	r := startRouterLog(t, cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if n := strings.Count(logs.String(), "admin routes answer loopback clients only"); n != 1 {
		t.Errorf("start-up logs say %d times that admin is loopback-only, want once:\n%s", n, logs)
	}
	// A loopback client (this test) reaches admin routes without a token,
	// and a client key does not matter.
	for _, path := range []string{"/api/workers", "/debug/decisions"} {
		if resp, body := do(t, "GET", r.url+path, "", ""); resp.StatusCode != 200 {
			t.Errorf("loopback GET %s: %d %s", path, resp.StatusCode, body)
		}
	}
	// A remote client does not, whatever it claims in headers.
	for _, tc := range []struct{ method, path string }{
		{"GET", "/api/workers"}, {"POST", "/api/workers"}, {"DELETE", "/api/workers/w1"},
		{"POST", "/api/workers/w1/drain"}, {"GET", "/debug/decisions"}, {"GET", "/api/overview"}, {"GET", "/no/such/route"},
	} {
		req := httptest.NewRequest(tc.method, tc.path, nil)
		req.RemoteAddr = "203.0.113.7:40000"
		req.Header.Set("X-Forwarded-For", "127.0.0.1")
		rec := httptest.NewRecorder()
		r.srv.Handler().ServeHTTP(rec, req)
		checkError(t, rec.Result(), rec.Body.String(), http.StatusForbidden, "admin_loopback_only")
	}
	if got := r.srv.Scheduler().Workers(); len(got) != 1 || got[0].Draining {
		t.Fatalf("a refused admin call changed the fleet: %+v", got)
	}
	// The dashboard's page itself holds no data: a remote browser gets
	// it, and then needs the admin token for what it shows.
	req := httptest.NewRequest("GET", "/", nil)
	req.RemoteAddr = "203.0.113.7:40000"
	rec := httptest.NewRecorder()
	r.srv.Handler().ServeHTTP(rec, req)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "<html") {
		t.Fatalf("remote GET /: %d, want the dashboard page", rec.Code)
	}
}

func TestGuard_AdminTokenIsRequiredWhenConfigured(t *testing.T) {
	logs := &syncBuffer{}
	cfg := keysConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		c.Auth.AdminTokenSHA256 = sha(keyAdmin)
	})
	r := startRouterLog(t, cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if strings.Contains(logs.String(), "loopback clients only") {
		t.Error("logs claim loopback-only admin although a token is set")
	}
	for _, tc := range []struct {
		name, token string
		status      int
	}{
		{"none, even from loopback", "", 401},
		{"a client key", keyAcme, 401},
		{"wrong", keyAdmin + "x", 401},
		{"admin", keyAdmin, 200},
	} {
		resp, body := do(t, "POST", r.url+"/api/workers/w1/drain", tc.token, "")
		if resp.StatusCode != tc.status {
			t.Errorf("%s: status %d, want %d: %s", tc.name, resp.StatusCode, tc.status, body)
		}
		if tc.status == 401 {
			checkError(t, resp, body, 401, "invalid_admin_token")
		}
	}
	// The admin token does not open inference routes.
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", keyAdmin, chat("a", false))
	checkError(t, resp, body, 401, "invalid_api_key")
}

func TestGuard_PerKeyRateLimit(t *testing.T) {
	r := startRouter(t, keysConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		c.Auth.Keys[0].Rate = 0.001 // one request, then one per 1000 s
	}))
	if resp, body := do(t, "POST", r.url+"/v1/chat/completions", keyAcme, chat("1", false)); resp.StatusCode != 200 {
		t.Fatalf("first request: %d %s", resp.StatusCode, body)
	}
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", keyAcme, chat("2", false))
	checkError(t, resp, body, http.StatusTooManyRequests, "rate_limited")
	if ra := resp.Header.Get("Retry-After"); ra == "" || ra == "0" {
		t.Errorf("Retry-After = %q, want the seconds until the next token", ra)
	}
	// Another key is not affected.
	if resp, body := do(t, "POST", r.url+"/v1/chat/completions", keyBeta, chat("3", false)); resp.StatusCode != 200 {
		t.Fatalf("other key: %d %s", resp.StatusCode, body)
	}
}

func TestGuard_PerKeyConcurrency(t *testing.T) {
	w := newFakeWorker(t, "w1")
	w.hold = make(chan struct{})
	w.arrived = make(chan string, 4)
	r := startRouter(t, keysConfig(t, []*fakeWorker{w}, func(c *config.Config) {
		c.Auth.Keys[0].MaxConcurrent = 1
		c.Workers[0].MaxConcurrency = 4
	}))
	first := make(chan int, 1)
	go func() {
		resp, _ := do(t, "POST", r.url+"/v1/chat/completions", keyAcme, chat("held", false))
		first <- resp.StatusCode
	}()
	<-w.arrived
	resp, body := do(t, "POST", r.url+"/v1/chat/completions", keyAcme, chat("second", false))
	checkError(t, resp, body, http.StatusTooManyRequests, "too_many_concurrent")
	w.hold <- struct{}{}
	if got := <-first; got != 200 {
		t.Fatalf("held request: %d", got)
	}
	go func() { w.hold <- struct{}{} }()
	if resp, body := do(t, "POST", r.url+"/v1/chat/completions", keyAcme, chat("third", false)); resp.StatusCode != 200 {
		t.Fatalf("after the first finished: %d %s", resp.StatusCode, body)
	}
}

func TestGuard_KeysNeverLeak(t *testing.T) {
	logs := &syncBuffer{}
	keyFile := filepath.Join(t.TempDir(), "beta.key")
	if err := os.WriteFile(keyFile, []byte(keyBeta+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := keysConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		c.Auth.Keys[1] = config.APIKey{KeyFile: keyFile, Tenant: "beta"}
		c.Decisions.File = filepath.Join(t.TempDir(), "decisions.jsonl")
	})
	r := startRouterLog(t, cfg, slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})))
	for _, k := range []string{keyAcme, keyBeta, "sk-wrong-guess", ""} {
		do(t, "POST", r.url+"/v1/chat/completions", k, chat("s", true))
		do(t, "POST", r.url+"/v1/chat/completions", k, chat("n", false))
	}
	var seen strings.Builder
	seen.WriteString(logs.String())
	for _, path := range []string{"/debug/decisions", "/metrics", "/api/workers"} {
		_, body := do(t, "GET", r.url+path, "", "")
		seen.WriteString(body)
	}
	r.stop(t)
	b, err := os.ReadFile(cfg.Decisions.File)
	if err != nil {
		t.Fatal(err)
	}
	seen.Write(b)
	all := seen.String()
	if !strings.Contains(all, `"decisions"`) || !strings.Contains(all, "sluice_") {
		t.Fatal("the collected output is missing the decision list or the metrics")
	}
	for _, secret := range []string{keyAcme, keyBeta, "sk-wrong-guess", sha(keyAcme), sha(keyBeta), sha(keyAcme)[:16]} {
		if strings.Contains(all, secret) {
			t.Errorf("%q appears in logs, decision records or metrics", secret)
		}
	}
}

func TestGuard_ReloadSwapsKeysAndKeepsThemOnError(t *testing.T) {
	w := newFakeWorker(t, "w1")
	cfg := keysConfig(t, []*fakeWorker{w}, nil)
	r := startRouter(t, cfg)
	next := cfg
	next.Auth.Keys = []config.APIKey{{KeySHA256: sha("sk-new"), Tenant: "new"}}
	if err := r.srv.Reload(next); err != nil {
		t.Fatal(err)
	}
	if resp, _ := do(t, "POST", r.url+"/v1/chat/completions", keyAcme, chat("old", false)); resp.StatusCode != 401 {
		t.Errorf("removed key still works: %d", resp.StatusCode)
	}
	if resp, body := do(t, "POST", r.url+"/v1/chat/completions", "sk-new", chat("new", false)); resp.StatusCode != 200 {
		t.Errorf("added key refused: %d %s", resp.StatusCode, body)
	}
	broken := next
	broken.Auth.Keys = []config.APIKey{{KeyFile: filepath.Join(t.TempDir(), "gone"), Tenant: "x"}}
	err := r.srv.Reload(broken)
	if err == nil || !strings.Contains(err.Error(), "auth.keys[0].key_file") {
		t.Fatalf("reload with a missing key file: err = %v", err)
	}
	if resp, body := do(t, "POST", r.url+"/v1/chat/completions", "sk-new", chat("kept", false)); resp.StatusCode != 200 {
		t.Errorf("a failed reload dropped the running keys: %d %s", resp.StatusCode, body)
	}
}

func TestClassify_EveryProxiedRouteIsAClientRoute(t *testing.T) {
	for _, p := range inferencePaths {
		if got := classify(p); got != routeClient {
			t.Errorf("classify(%q) = %v, want a client route", p, got)
		}
	}
	for p, want := range map[string]routeClass{
		"/v1/models": routeClient, "/healthz": routePublic, "/readyz": routePublic, "/metrics": routePublic,
		"/": routePublic, "/dashboard/app.js": routePublic, "/api/overview": routeAdmin, "/api/workers": routeAdmin,
		"/debug/decisions": routeAdmin, "/anything-new": routeAdmin,
	} {
		if got := classify(p); got != want {
			t.Errorf("classify(%q) = %v, want %v", p, got, want)
		}
	}
}

func TestGuard_KeysTenantAndClassReachTheDecisionRecord(t *testing.T) {
	r := startRouter(t, keysConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, nil))
	for _, tc := range []struct{ key, tenant, class string }{
		{keyAcme, "acme", "interactive"},
		{keyBeta, "beta", "batch"},
	} {
		resp, body := do(t, "POST", r.url+"/v1/chat/completions", tc.key, chat(tc.tenant, false))
		if resp.StatusCode != 200 {
			t.Fatalf("status %d: %s", resp.StatusCode, body)
		}
		id := resp.Header.Get("X-Sluice-Decision")
		_, rec := do(t, "GET", r.url+"/debug/decisions/"+id, "", "")
		var got struct{ Tenant, Class string }
		if err := json.Unmarshal([]byte(rec), &got); err != nil {
			t.Fatal(err)
		}
		if got.Tenant != tc.tenant || got.Class != tc.class {
			t.Errorf("decision %s: tenant %q class %q, want %q %q", id, got.Tenant, got.Class, tc.tenant, tc.class)
		}
	}
}

func TestGuard_AdminNeedsTheTokenWhenListeningBeyondLoopback(t *testing.T) {
	logs := &syncBuffer{}
	cfg := keysConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		c.Listen = "0.0.0.0:8080"
	})
	r := startRouterLog(t, cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if !strings.Contains(logs.String(), "admin routes are refused") || !strings.Contains(logs.String(), "auth.admin_token_file") {
		t.Errorf("start-up logs do not say that admin routes are refused until a token is set:\n%s", logs)
	}
	// The client is on loopback, as a same-host ingress or sidecar is:
	// that says nothing of who sent the request.
	for _, tc := range []struct{ method, path, body string }{
		{"GET", "/api/workers", ""}, {"POST", "/api/workers", `{"name":"evil","url":"http://203.0.113.9:80","kind":"openai","models":["m"]}`},
		{"DELETE", "/api/workers/w1", ""}, {"POST", "/api/workers/w1/drain", ""}, {"GET", "/debug/decisions", ""}, {"GET", "/api/overview", ""},
	} {
		resp, body := do(t, tc.method, r.url+tc.path, "", tc.body)
		checkError(t, resp, body, http.StatusForbidden, "admin_token_required")
		if !strings.Contains(body, "auth.admin_token_sha256") {
			t.Errorf("%s %s: the refusal does not say which setting opens it: %s", tc.method, tc.path, body)
		}
	}
	if got := r.srv.Scheduler().Workers(); len(got) != 1 || got[0].Name != "w1" || got[0].Draining {
		t.Fatalf("a refused admin call changed the fleet: %+v", got)
	}
	// Probes and the client API are not admin routes.
	if resp, body := do(t, "GET", r.url+"/healthz", "", ""); resp.StatusCode != 200 {
		t.Errorf("/healthz: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(t, "POST", r.url+"/v1/chat/completions", keyAcme, chat("a", false)); resp.StatusCode != 200 {
		t.Errorf("inference: %d %s", resp.StatusCode, body)
	}
}

func TestGuard_AdminTokenOpensAdminBeyondLoopback(t *testing.T) {
	logs := &syncBuffer{}
	cfg := keysConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		c.Listen = ":8080"
		c.Auth.AdminTokenSHA256 = sha(keyAdmin)
	})
	r := startRouterLog(t, cfg, slog.New(slog.NewTextHandler(logs, nil)))
	if strings.Contains(logs.String(), "admin routes are refused") {
		t.Errorf("logs say admin routes are refused although a token is set:\n%s", logs)
	}
	resp, body := do(t, "GET", r.url+"/api/workers", "", "")
	checkError(t, resp, body, http.StatusUnauthorized, "invalid_admin_token")
	if resp, body := do(t, "GET", r.url+"/api/workers", keyAdmin, ""); resp.StatusCode != 200 {
		t.Fatalf("with the admin token: %d %s", resp.StatusCode, body)
	}
}

func TestLoopbackOnly(t *testing.T) {
	for listen, want := range map[string]bool{
		"127.0.0.1:8080": true, "127.0.0.2:8080": true, "[::1]:8080": true, "localhost:8080": true,
		"0.0.0.0:8080": false, ":8080": false, "[::]:8080": false, "10.0.0.5:8080": false,
		"sluice.example.com:8080": false, "[::ffff:127.0.0.1]:8080": true, "no-port": false,
	} {
		if got := loopbackOnly(listen); got != want {
			t.Errorf("loopbackOnly(%q) = %v, want %v", listen, got, want)
		}
	}
}
