package server

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// X-Sluice-Priority picks the request's class; the decision record shows
// the class and the output estimate, which the answers teach.
func TestServer_PriorityHeaderAndLearntEstimate(t *testing.T) {
	w := newFakeWorker(t, "w0")
	r := startRouter(t, testConfig(t, []*fakeWorker{w}, nil))
	send := func(class string) *http.Response {
		req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, r.url+"/v1/chat/completions", strings.NewReader(chat("x", false)))
		req.Header.Set("Content-Type", "application/json")
		if class != "" {
			req.Header.Set("X-Sluice-Priority", class)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	record := func(resp *http.Response) map[string]any {
		t.Helper()
		readAll(t, resp)
		id := resp.Header.Get("X-Sluice-Decision")
		got, err := http.Get(r.url + "/debug/decisions/" + id)
		if err != nil {
			t.Fatal(err)
		}
		var rec map[string]any
		if err := json.Unmarshal([]byte(readAll(t, got)), &rec); err != nil {
			t.Fatal(err)
		}
		return rec
	}

	bad := send("urgent")
	body := readAll(t, bad)
	if bad.StatusCode != http.StatusBadRequest || bad.Header.Get("X-Sluice-Reason") != "unknown_priority_class" || !strings.Contains(body, `\"urgent\"`) {
		t.Fatalf("unknown class: status %d reason %q body %s", bad.StatusCode, bad.Header.Get("X-Sluice-Reason"), body)
	}

	first := record(send("batch"))
	if first["class"] != "batch" || first["estimate_source"] != "max_tokens" || first["expected_output_tokens"] != 16.0 {
		t.Fatalf("first record class %v, estimate %v from %v; want batch, 16 from max_tokens (it caps the default 256)",
			first["class"], first["expected_output_tokens"], first["estimate_source"])
	}
	second := record(send(""))
	if second["class"] != "interactive" || second["estimate_source"] != "model" || second["expected_output_tokens"] != 5.0 {
		t.Fatalf("second record class %v, estimate %v from %v; want interactive, 5 (the first answer's tokens) from model",
			second["class"], second["expected_output_tokens"], second["estimate_source"])
	}
}
