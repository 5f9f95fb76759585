package server

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
)

// keyedWorker is a llama-server stand-in that answers only requests
// carrying its key (when it has one), and remembers every Authorization
// header it was sent.
type keyedWorker struct {
	srv *httptest.Server
	key string

	mu    sync.Mutex
	auths map[string][]string // path -> Authorization values seen
}

func newKeyedWorker(t *testing.T, key string) *keyedWorker {
	k := &keyedWorker{key: key, auths: map[string][]string{}}
	k.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		k.mu.Lock()
		k.auths[r.URL.Path] = append(k.auths[r.URL.Path], r.Header.Get("Authorization"))
		k.mu.Unlock()
		if k.key != "" && r.Header.Get("Authorization") != "Bearer "+k.key {
			w.WriteHeader(http.StatusUnauthorized)
			io.WriteString(w, `{"error":{"message":"Invalid API Key","type":"authentication_error"}}`)
			return
		}
		switch r.URL.Path {
		case "/health":
			io.WriteString(w, `{"status":"ok"}`)
		case "/v1/models":
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
		case "/props":
			io.WriteString(w, `{"total_slots":2}`)
		case "/metrics":
			io.WriteString(w, "llamacpp:requests_processing 0\nllamacpp:requests_deferred 0\n")
		case "/v1/chat/completions":
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":1}}`)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(k.srv.Close)
	return k
}

func (k *keyedWorker) seen() map[string][]string {
	k.mu.Lock()
	defer k.mu.Unlock()
	out := map[string][]string{}
	for p, v := range k.auths {
		out[p] = append([]string(nil), v...)
	}
	return out
}

func TestRouter_WorkerAPIKeys(t *testing.T) {
	const workerKey, clientKey = "worker-secret-4f1c", "client-secret-9a7e"
	keyFile := filepath.Join(t.TempDir(), "key")
	if err := os.WriteFile(keyFile, []byte(workerKey+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("SLUICE_TEST_WORKER_KEY", workerKey)
	tests := []struct {
		name     string
		key      string // the worker demands this key
		edit     func(*config.Worker)
		wantAuth string // what the worker must see on the proxied request
	}{
		{"api_key", workerKey, func(w *config.Worker) { w.APIKey = workerKey }, "Bearer " + workerKey},
		{"api_key_env", workerKey, func(w *config.Worker) { w.APIKeyEnv = "SLUICE_TEST_WORKER_KEY" }, "Bearer " + workerKey},
		{"api_key_file", workerKey, func(w *config.Worker) { w.APIKeyFile = keyFile }, "Bearer " + workerKey},
		{"no key: the client's is not forwarded", "", nil, ""},
		{"no key, forward_client_auth", "", func(w *config.Worker) { w.ForwardClientAuth = true }, "Bearer " + clientKey},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kw := newKeyedWorker(t, tt.key)
			var logs bytes.Buffer
			cfg := config.DefaultConfig()
			wc := config.Worker{Name: "gpu0", URL: kw.srv.URL, Kind: "llamacpp", Models: []string{"m"}}
			if tt.edit != nil {
				tt.edit(&wc)
			}
			cfg.Workers = []config.Worker{wc}
			cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter = time.Hour, time.Hour
			if err := cfg.Validate(); err != nil {
				t.Fatal(err)
			}
			srv, err := New(cfg, Options{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
			if err != nil {
				t.Fatal(err)
			}
			hs := httptest.NewServer(srv.Handler())
			t.Cleanup(func() { hs.Close(); srv.Close() })
			srv.ScrapeNow(context.Background())

			req, _ := http.NewRequest(http.MethodPost, hs.URL+"/v1/chat/completions", strings.NewReader(chat("x", false)))
			req.Header.Set("Authorization", "Bearer "+clientKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			if body := readAll(t, resp); resp.StatusCode != 200 {
				t.Fatalf("proxied request: %d %s", resp.StatusCode, body)
			}
			seen := kw.seen()
			if got := seen["/v1/chat/completions"]; len(got) != 1 || got[0] != tt.wantAuth {
				t.Fatalf("worker saw Authorization %q on the request, want %q", got, tt.wantAuth)
			}
			for _, p := range []string{"/health", "/metrics", "/props", "/v1/models"} {
				for _, a := range seen[p] {
					if want := map[bool]string{true: "Bearer " + tt.key, false: ""}[tt.key != ""]; a != want {
						t.Errorf("probe %s carried Authorization %q, want %q", p, a, want)
					}
				}
			}
			if len(seen["/health"]) == 0 || len(seen["/v1/models"]) == 0 {
				t.Errorf("no probe reached the worker: %v", seen)
			}
			if st := srv.fleet.Get("gpu0").State(); st.ConsecutiveFailures != 0 || st.LastError != "" {
				t.Errorf("probes failed: %+v", st)
			}
			resp, err = http.Get(hs.URL + "/api/workers")
			if err != nil {
				t.Fatal(err)
			}
			if body := readAll(t, resp); strings.Contains(body, workerKey) {
				t.Errorf("/api/workers shows the worker's key:\n%s", body)
			}
			if strings.Contains(logs.String(), workerKey) || strings.Contains(logs.String(), clientKey) {
				t.Errorf("a key reached the log:\n%s", logs.String())
			}
		})
	}
}

func TestConfig_WorkerAPIKeyValidation(t *testing.T) {
	tests := []struct{ name, worker, want string }{
		{"two sources", `api_key: a, api_key_env: B`, "workers[0].api_key: set at most one"},
		{"env unset", `api_key_env: SLUICE_TEST_SURELY_UNSET_VAR`, "workers[0].api_key_env: environment variable SLUICE_TEST_SURELY_UNSET_VAR is unset or empty"},
		{"file missing", `api_key_file: /nonexistent/key`, "workers[0].api_key_file: read key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := config.Check("", []byte("workers: [{name: a, url: 'http://127.0.0.1:1', "+tt.worker+"}]\n")).Err()
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err %v, want %q", err, tt.want)
			}
		})
	}
}

func TestRouter_ForwardedHeaders(t *testing.T) {
	got := make(chan http.Header, 1)
	ws := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			got <- r.Header.Clone()
		}
		io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
	}))
	defer ws.Close()
	cfg := config.DefaultConfig()
	cfg.Workers = []config.Worker{{Name: "gpu0", URL: ws.URL, Kind: "openai", Models: []string{"m"}}}
	cfg.Telemetry.Interval, cfg.Telemetry.StaleAfter = time.Hour, time.Hour
	r := startRouter(t, cfg)
	req, _ := http.NewRequest(http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(chat("x", false)))
	req.Header.Set("X-Forwarded-For", "203.0.113.7")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	readAll(t, resp)
	h := <-got
	host := strings.TrimPrefix(r.url, "http://")
	for k, want := range map[string]string{"X-Forwarded-For": "203.0.113.7, 127.0.0.1", "X-Forwarded-Proto": "http", "X-Forwarded-Host": host} {
		if v := h.Get(k); v != want {
			t.Errorf("%s: %q, want %q", k, v, want)
		}
	}
}
