package sim

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/sluice-router/sluice/internal/telemetry"
)

func newLoRAServer(t *testing.T, l *LoRA) (*Server, *httptest.Server) {
	t.Helper()
	srv, err := NewServer(testParams(), Options{TimeScale: 1000, Name: "lora", LoRA: l})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(srv)
	t.Cleanup(func() { srv.Close(); hs.Close() })
	<-srv.Ready()
	return srv, hs
}

func models(t *testing.T, url string) []telemetry.ModelCard {
	t.Helper()
	resp, err := http.Get(url + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	cards, err := telemetry.ParseModelCards(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return cards
}

// The simulator lists its adapters as vLLM does, loads one at run time
// and refuses a request for one it has not loaded with vLLM's 404.
func TestServer_LoRA(t *testing.T) {
	srv, hs := newLoRAServer(t, &LoRA{Adapters: []string{"sql"}, RuntimeLoading: true})
	base := srv.Params().Model
	if got := models(t, hs.URL); len(got) != 2 || got[1].ID != "sql" || got[1].Parent != base || got[0].Parent != "" {
		t.Fatalf("models = %+v, want %s and sql with parent %s", got, base, base)
	}
	chat := func(model string) (int, string) {
		resp := post(t, hs.URL+"/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"hi"}],"max_tokens":2}`)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	tests := []struct {
		name, body string
		status     int
		want       string
	}{
		{name: "missing path", body: `{"lora_name":"chat"}`, status: 400, want: "Both 'lora_name' and 'lora_path' must be provided."},
		{name: "load", body: `{"lora_name":"chat","lora_path":"/a/chat"}`, status: 200, want: "Success: LoRA adapter 'chat' added successfully."},
		{name: "again", body: `{"lora_name":"chat","lora_path":"/a/chat"}`, status: 400, want: "has already been loaded"},
	}
	if st, body := chat("chat"); st != http.StatusNotFound {
		t.Fatalf("chat before its load: %d %s, want 404", st, body)
	} else {
		var e struct {
			Error struct {
				Message, Type string
				Code          int
			}
		}
		if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Type != "NotFoundError" || e.Error.Code != 404 || e.Error.Message != "The model `chat` does not exist." {
			t.Fatalf("404 body %s (%v), want vLLM's NotFoundError", body, err)
		}
	}
	for _, tt := range tests {
		resp := post(t, hs.URL+"/v1/load_lora_adapter", tt.body)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != tt.status || !strings.Contains(string(b), tt.want) {
			t.Errorf("%s: %d %s, want %d %q", tt.name, resp.StatusCode, b, tt.status, tt.want)
		}
	}
	for _, m := range []string{base, "sql", "chat"} {
		if st, body := chat(m); st != http.StatusOK {
			t.Errorf("%s: %d %s, want 200", m, st, body)
		}
	}
	if names, loads := srv.LoRAAdapters(); len(names) != 2 || loads != 1 {
		t.Errorf("adapters %v, %d loads; want sql, chat and 1", names, loads)
	}
}

// Without runtime loading the endpoint is not there, as in vLLM.
func TestServer_LoRANoRuntimeLoading(t *testing.T) {
	_, hs := newLoRAServer(t, &LoRA{})
	resp := post(t, hs.URL+"/v1/load_lora_adapter", `{"lora_name":"chat","lora_path":"/a/chat"}`)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("load without runtime loading: %d, want 404", resp.StatusCode)
	}
}
