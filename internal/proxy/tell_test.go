package proxy

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/scheduler"
)

// secret is in every worker's error answer here: what a worker says of
// its failure is the operator's to read, not the client's.
const secret = "CUDA error at 10.9.8.7: secret-worker-detail"

// leaks returns what of the network behind Sluice a client's answer
// shows: an address, a Go network error, a worker's own words.
func leaks(body string) []string {
	var out []string
	for _, s := range []string{"127.0.0.1", "dial tcp", "read tcp", "connection refused", "connection reset", "secret-worker-detail", "10.9.8.7"} {
		if strings.Contains(body, s) {
			out = append(out, s)
		}
	}
	return out
}

// When every worker tried fails before answering — one refuses the
// connection, one answers 500 — the client's 502 says, in the shape of
// its API, that no worker could answer for its model, and names the
// decision; not the worker's address, the Go error or the worker's body,
// which the log has, with the decision.
func TestHandler_NoAnswerSaysWhatFailedNotWhere(t *testing.T) {
	bodies := map[string]string{
		"/v1/chat/completions": `{"model":"m","messages":[{"role":"user","content":"hello"}]}`,
		"/v1/messages":         `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hello"}]}`,
	}
	down := testWorker{"w0", "http://127.0.0.1:1"} // nothing listens on port 1
	for _, tt := range []struct {
		name   string
		worker testWorker
		logged string // what the log says of the failure
	}{
		{"connection refused", down, "connection refused"},
		{"worker answers 500", startWorker(t, "w0", failingWorker(http.StatusInternalServerError, secret)), "secret-worker-detail"},
	} {
		for path, body := range bodies {
			t.Run(tt.name+" "+path, func(t *testing.T) {
				r := newTestRouter(t, scheduler.Config{}, Options{}, nil, tt.worker)
				status, got, hdr := r.post(path, body)
				if status != http.StatusBadGateway {
					t.Fatalf("status %d, body %s; want 502", status, got)
				}
				if l := leaks(got); len(l) > 0 {
					t.Errorf("the client is told %q: %s", l, got)
				}
				msg := errorMessage(t, path, got)
				id := hdr.Get("X-Sluice-Decision")
				if id == "" || !strings.Contains(msg, id) || !strings.Contains(msg, `model "m"`) {
					t.Errorf("message %q (decision %q); want it to name model \"m\" and the decision", msg, id)
				}
				if logs := r.logs.String(); !strings.Contains(logs, tt.logged) || id == "" || !strings.Contains(logs, "decision="+id) {
					t.Errorf("log %q; want %q with decision=%s", logs, tt.logged, id)
				}
			})
		}
	}
}

// errorMessage is the message of an error answer in the API of path.
func errorMessage(t *testing.T, path, body string) string {
	t.Helper()
	var e struct {
		Type  string `json:"type"`
		Error struct {
			Type    string `json:"type"`
			Message string `json:"message"`
			Code    string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil {
		t.Fatalf("error body %q: %v", body, err)
	}
	if path == "/v1/messages" && (e.Type != "error" || e.Error.Type != "api_error") {
		t.Errorf("body %s: want Anthropic's error shape, api_error", body)
	}
	if path != "/v1/messages" && (e.Error.Code != "upstream_failed" || e.Error.Type != "server_error") {
		t.Errorf("body %s: want OpenAI's error shape, upstream_failed", body)
	}
	return e.Error.Message
}

// A stream its worker breaks for good — a connection reset mid-way, with
// or without a continuation that fails in turn (a 500 with the worker's
// words) — ends with Sluice's error event, which says the answer for the
// model broke off and names the decision: not the read error (with both
// ends' addresses), nor the continuing worker's answer.
func TestHandler_StreamErrorEventSaysWhatFailedNotWhere(t *testing.T) {
	for _, tt := range []struct {
		name, path, body string
		continuations    int
	}{
		{"chat", "/v1/chat/completions", chatStreamBody, 0},
		{"messages", "/v1/messages", `{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hello"}]}`, 0},
		{"chat continued on a worker that fails", "/v1/chat/completions", chatStreamBody, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reset := make(chan struct{})
			ws := []testWorker{startWorker(t, "w0", resettingWorker(t, 2, reset))}
			if tt.continuations > 0 {
				ws = append(ws, startWorker(t, "w1", failingWorker(http.StatusInternalServerError, secret)))
			}
			r := newTestRouter(t, scheduler.Config{}, Options{MaxContinuations: tt.continuations}, nil, ws...)
			resp, err := r.srv.Client().Post(r.srv.URL+tt.path, "application/json", strings.NewReader(tt.body))
			if err != nil {
				close(reset)
				t.Fatal(err)
			}
			defer resp.Body.Close()
			// The first event reached the client: the worker resets its
			// connection mid-stream.
			br := bufio.NewReader(resp.Body)
			first, err := br.ReadString('\n')
			close(reset)
			if err != nil || !strings.HasPrefix(first, "data: ") {
				t.Fatalf("first line %q, %v; want the worker's first event", first, err)
			}
			rest, _ := io.ReadAll(br)
			got := first + string(rest)
			mark := `data: {"error"` // Sluice's event, in the API's shape
			if tt.path == "/v1/messages" {
				mark = "event: error"
			}
			i := strings.LastIndex(got, mark)
			if i < 0 {
				t.Fatalf("stream %q; want it to end with Sluice's error event", got)
			}
			event := got[i:]
			if l := leaks(got); len(l) > 0 {
				t.Errorf("the client is told %q: %s", l, event)
			}
			id := resp.Header.Get("X-Sluice-Decision")
			if id == "" || !strings.Contains(event, id) || !strings.Contains(event, `model \"m\"`) {
				t.Errorf("error event %q (decision %q); want it to name model \"m\" and the decision", event, id)
			}
			logged := "connection reset"
			if tt.continuations > 0 {
				logged = "secret-worker-detail"
			}
			if logs := r.logs.String(); !strings.Contains(logs, logged) {
				t.Errorf("log %q; want %q", logs, logged)
			}
		})
	}
}
