package server

import (
	"net/http"
	"strings"
	"testing"
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
