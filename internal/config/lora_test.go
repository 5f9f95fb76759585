package config

import (
	"strings"
	"testing"
)

func TestLoRA_Validate(t *testing.T) {
	const workers = "workers:\n  - {name: a, url: 'http://127.0.0.1:1', kind: vllm, models: [llama-3-8b], kv_events: 'tcp://127.0.0.1:5557'}\n"
	tests := []struct {
		name string
		yaml string
		want []string // substrings of the error; none: valid
	}{
		{name: "valid", yaml: "lora:\n  load_on_demand: true\n  adapters: [{name: sql, base: llama-3-8b, path: /a/sql}]\n"},
		{name: "base misspelt", yaml: "lora:\n  adapters: [{name: sql, base: llama-3-8}]\n", want: []string{"lora.adapters[0].base", "did you mean `llama-3-8b`?"}},
		{name: "no path on demand", yaml: "lora:\n  load_on_demand: true\n  adapters: [{name: sql, base: llama-3-8b}]\n", want: []string{"lora.adapters[0].path: missing"}},
		{name: "duplicate", yaml: "lora:\n  adapters: [{name: sql, base: llama-3-8b}, {name: sql, base: llama-3-8b}]\n", want: []string{"lora.adapters[1].name", "duplicate"}},
		{name: "adapter named as a model", yaml: "lora:\n  adapters: [{name: llama-3-8b, base: llama-3-8b}]\n", want: []string{"lora.adapters[0].name", "ambiguous"}},
		{name: "max replicas", yaml: "lora:\n  max_replicas: 0\n", want: []string{"lora.max_replicas"}},
		{name: "unknown key", yaml: "lora:\n  max_replica: 3\n", want: []string{"did you mean `max_replicas`?"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(workers + tt.yaml)
			if len(tt.want) == 0 {
				if err != nil {
					t.Fatalf("err = %v, want none", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("no error, want %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to say %q", err, w)
				}
			}
		})
	}
}

func TestWorker_KVEventsValidate(t *testing.T) {
	tests := []struct {
		kv, replay string
		want       string
	}{
		{kv: "tcp://10.0.0.5:5557", replay: "tcp://10.0.0.5:5558"},
		{kv: "http://10.0.0.5:5557", want: "workers[0].kv_events: \"http://10.0.0.5:5557\": scheme must be tcp"},
		{kv: "tcp://*:5557", want: "want tcp://host:port of the worker"},
		{replay: "tcp://10.0.0.5:5558", want: "workers[0].kv_events_replay: set without kv_events"},
	}
	for _, tt := range tests {
		y := "workers:\n  - {name: a, url: 'http://127.0.0.1:1', kind: vllm, kv_events: '" + tt.kv + "', kv_events_replay: '" + tt.replay + "'}\n"
		_, err := parse(y)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("%s %s: %v", tt.kv, tt.replay, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("%s %s: err %v, want %q", tt.kv, tt.replay, err, tt.want)
		}
	}
}
