package config

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// TestCheck_ReportsEveryProblemWithKeyAndLine checks that a typo and a
// value of the wrong type do not hide the rest of the file: every problem
// comes out at once, in file order, by key path and line.
func TestCheck_ReportsEveryProblemWithKeyAndLine(t *testing.T) {
	const file = `listen: 127.0.0.1:8080
workers:
  - name: a
    url: ftp://gpu-a
    kind: triton
    max_concurency: 4
  - name: b
    url: http://gpu-b:8080
admission:
  queue_timeout: '30'
weights:
  prefix: -1
stats:
  store: 'etcd://h:1'
`
	rep := Check("sluice.yaml", []byte(file))
	var got []string
	for _, p := range rep.Problems {
		got = append(got, p.Error())
	}
	want := []string{
		`sluice.yaml:4: workers[0].url: "ftp://gpu-a": scheme must be http or https`,
		`sluice.yaml:5: workers[0].kind: "triton" is not one of llamacpp, vllm, sglang, tgi, trtllm, ollama, openai`,
		"sluice.yaml:6: workers[0].max_concurency: unknown key `max_concurency`; did you mean `max_concurrency`?",
		`sluice.yaml:10: admission.queue_timeout: must be a duration with its unit, e.g. 30s, 500ms, 2m or 1h30m, got the quoted text "30"`,
		"sluice.yaml:12: weights.prefix: negative weight -1 (the term is already a reward; 0 turns it off)",
		`sluice.yaml:14: stats.store: "etcd://h:1": a file path, or a redis:// or rediss:// URL`,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("problems (-want +got):\n%s", diff)
	}
	if err := rep.Err(); err == nil || strings.Count(err.Error(), "\n")+1 != len(want) {
		t.Errorf("Err() = %v, want the %d problems one a line", err, len(want))
	}
}

// TestCheck_NearMissesGetASuggestion checks the message of an unknown key:
// a typo of a key of the same section is named, a key of another section
// is pointed to where it belongs, and anything else lists what the section
// has.
func TestCheck_NearMissesGetASuggestion(t *testing.T) {
	tests := []struct {
		name, yaml, want string
	}{
		{"missing letter", "workers: [{name: a, url: 'http://h:1', max_concurency: 2}]",
			"line 1: workers[0].max_concurency: unknown key `max_concurency`; did you mean `max_concurrency`?"},
		{"swapped letters", "workers: [{name: a, url: 'http://h:1', modles: [m]}]",
			"line 1: workers[0].modles: unknown key `modles`; did you mean `models`?"},
		{"capitals", "workers: [{name: a, url: 'http://h:1'}]\nadmission: {Max_Queue: 3}",
			"line 2: admission.Max_Queue: unknown key `Max_Queue`; did you mean `max_queue`?"},
		{"key of another section", "workers: [{name: a, url: 'http://h:1'}]\nqueue_timeout: 5s",
			"line 2: queue_timeout: unknown key `queue_timeout` here; did you mean `admission.queue_timeout`?"},
		{"nothing near", "workers: [{name: a, url: 'http://h:1'}]\ntls: {colour: red}",
			"line 2: tls.colour: unknown key `colour`; `tls` has: cert_file, key_file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := Check("", []byte(tt.yaml))
			if len(rep.Problems) != 1 {
				t.Fatalf("problems %v, want one", rep.Problems)
			}
			if got := rep.Problems[0].Error(); got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
		})
	}
}

// TestCheck_WrongTypesInOperatorWords checks that a value of the wrong
// type is reported by what the key takes, never by a Go type.
func TestCheck_WrongTypesInOperatorWords(t *testing.T) {
	const w = "workers: [{name: a, url: 'http://h:1'}]\n"
	tests := []struct {
		name, yaml, want string
	}{
		{"duration without unit", w + "telemetry: {interval: 30}",
			`line 2: telemetry.interval: must be a duration with its unit, e.g. 30s, 500ms, 2m or 1h30m, got "30"`},
		{"bool", w + "admission: {kv_fit: sometimes}", `line 2: admission.kv_fit: must be true or false, got "sometimes"`},
		{"int", w + "proxy: {max_attempts: 2.5}", `line 2: proxy.max_attempts: must be a whole number, got "2.5"`},
		{"float", w + "weights: {prefix: high}", `line 2: weights.prefix: must be a number, got "high"`},
		{"list for text", w + "listen: [a, b]", "line 2: listen: must be a text value, got a list"},
		{"value for section", w + "weights: 5", `line 2: weights: must be a section of keys (key: value, one a line below it), got "5"`},
		{"value for list", "workers: gpu-a", `line 1: workers: must be a list (one ` + "`- item`" + ` a line, or [a, b]), got "gpu-a"`},
		{"value for map", w + "admission: {tenant_weights: 3}", `line 2: admission.tenant_weights: must be a map of names to values (name: value), got "3"`},
		{"map value", w + "admission: {tenant_weights: {acme: lots}}", `line 2: admission.tenant_weights.acme: must be a number, got "lots"`},
		{"concurrency", "workers: [{name: a, url: 'http://h:1', max_concurrency: many}]", `line 1: workers[0].max_concurrency: "many" is neither a whole number nor auto`},
		{"key twice", w + "listen: a:1\nlisten: b:2", "line 3: listen: given twice (also on line 2); the second would silently win"},
		{"not yaml", "workers: [a\n", "line 1: not valid YAML: did not find expected ',' or ']'"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rep := Check("", []byte(tt.yaml))
			if len(rep.Problems) != 1 {
				t.Fatalf("problems %v, want one", rep.Problems)
			}
			got := rep.Problems[0].Error()
			if got != tt.want {
				t.Errorf("got  %s\nwant %s", got, tt.want)
			}
			for _, goSpeak := range []string{"time.Duration", "config.", "scheduler.", "Go ", "int64", "float64", "!!"} {
				if strings.Contains(got, goSpeak) {
					t.Errorf("%q speaks Go (%q)", got, goSpeak)
				}
			}
		})
	}
}

// TestCheck_AWrongValueKeepsItsDefault checks what the decoded config
// holds when a value is wrong: the default, so the rest validates as if
// the key were left out, and nothing is reported twice.
func TestCheck_AWrongValueKeepsItsDefault(t *testing.T) {
	rep := Check("", []byte("workers: [{name: a, url: [x]}]\nadmission: {queue_timeout: soon, max_queue: 9}\n"))
	var keys []string
	for _, p := range rep.Problems {
		keys = append(keys, p.Key)
	}
	if diff := cmp.Diff([]string{"workers[0].url", "admission.queue_timeout"}, keys); diff != "" {
		t.Errorf("problem keys (-want +got):\n%s", diff)
	}
	if got, want := rep.Config.Admission.QueueTimeout, DefaultConfig().Admission.QueueTimeout; got != want {
		t.Errorf("queue_timeout %v, want the default %v", got, want)
	}
	if got := rep.Config.Admission.MaxQueue; got != 9 {
		t.Errorf("max_queue %d, want 9: a problem beside it must not stop its decoding", got)
	}
}
