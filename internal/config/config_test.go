package config

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"go.yaml.in/yaml/v3"
)

const good = `
listen: 127.0.0.1:9000
workers:
  - name: gpu0
    url: http://127.0.0.1:8081
    models: [llama]
  - name: gpu1
    url: http://127.0.0.1:8082
    kind: vllm
    max_concurrency: 4
weights:
  prefix: 0
admission:
  queue_timeout: 5s
`

func TestParse_DefaultsFillWhatIsLeftOut(t *testing.T) {
	cfg, err := parse(good)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Workers[0].Kind, "llamacpp"; got != want {
		t.Errorf("default kind %q, want %q", got, want)
	}
	if got := cfg.Weights.Prefix; got != 0 {
		t.Errorf("prefix weight %v, want the explicit 0", got)
	}
	if got, want := cfg.Weights.Scheduler().ActiveRequests, 100.0; got != want {
		t.Errorf("active weight %v, want default %v", got, want)
	}
	if got, want := cfg.Admission.QueueTimeout, 5*time.Second; got != want {
		t.Errorf("queue timeout %v, want %v", got, want)
	}
	if got, want := cfg.Admission.MaxQueue, DefaultConfig().Admission.MaxQueue; got != want {
		t.Errorf("max queue %v, want default %v", got, want)
	}
}

func TestParse_AdmissionClasses(t *testing.T) {
	cfg, err := parse("workers: [{name: a, url: 'http://h:1'}]")
	if err != nil {
		t.Fatal(err)
	}
	if got := cfg.Admission.Classes; len(got) != 2 || got[0].Name != "interactive" || got[1].Name != "batch" {
		t.Fatalf("default classes %+v, want interactive then batch", got)
	}
	cfg, err = parse("workers: [{name: a, url: 'http://h:1'}]\nadmission:\n  classes: [{name: bulk, priority: 5, max_queue_wait: 2m}]\n  tenant_weights: {acme: 2}\n")
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.Admission
	if len(a.Classes) != 1 || a.Classes[0].Name != "bulk" || a.Classes[0].Priority != 5 || a.Classes[0].MaxQueueWait != 2*time.Minute {
		t.Errorf("classes %+v, want only bulk", a.Classes)
	}
	if a.TenantWeights["acme"] != 2 {
		t.Errorf("tenant weights %v", a.TenantWeights)
	}
}

func TestParse_KVFitOnUnlessTurnedOff(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want bool
	}{
		{"workers: [{name: a, url: 'http://h:1'}]", true},
		{"workers: [{name: a, url: 'http://h:1'}]\nadmission: {max_queue: 9}", true},
		{"workers: [{name: a, url: 'http://h:1'}]\nadmission: {kv_fit: false}", false},
	} {
		cfg, err := parse(tc.yaml)
		if err != nil {
			t.Fatalf("%q: %v", tc.yaml, err)
		}
		if got := cfg.Admission.KVFit; got != tc.want {
			t.Errorf("%q: admission.kv_fit = %v, want %v", tc.yaml, got, tc.want)
		}
	}
}

func TestParse_BadConfigsNameTheKey(t *testing.T) {
	tests := []struct {
		name, yaml string
		want       []string // substrings of the error
	}{
		{"unknown key", "listen: 127.0.0.1:1\nlisten_addr: x\nworkers: [{name: a, url: 'http://h:1'}]", []string{"line 2", "listen_addr: unknown key `listen_addr`"}},
		{"unknown worker key", "workers: [{name: a, url: 'http://h:1', modle: x}]", []string{"workers[0].modle: unknown key `modle`; did you mean `models`?"}},
		{"no workers", "listen: 127.0.0.1:1", []string{"workers: at least one worker"}},
		{"bad url", "workers: [{name: a, url: 'ftp://h'}]", []string{"workers[0].url", "scheme"}},
		{"missing url", "workers: [{name: a}]", []string{"workers[0].url: missing"}},
		{"url without a scheme", "workers: [{name: a, url: '127.0.0.1:19081'}]", []string{`workers[0].url: "127.0.0.1:19081" has no scheme; add http:// (or https://)`}},
		{"host name without a scheme", "workers: [{name: a, url: 'gpu1:8000'}]", []string{`workers[0].url: "gpu1:8000" has no scheme; add http:// (or https://)`}},
		{"host alone", "workers: [{name: a, url: 'gpu1'}]", []string{`workers[0].url: "gpu1" has no scheme; add http:// (or https://)`}},
		{"metrics url without a scheme", "workers: [{name: a, url: 'http://h:1', gpu_metrics: 'h:9400/metrics'}]", []string{`workers[0].gpu_metrics: "h:9400/metrics" has no scheme; add http:// (or https://)`}},
		{"duplicate name", "workers: [{name: a, url: 'http://h:1'}, {name: a, url: 'http://h:2'}]", []string{"workers[1].name: duplicate worker name \"a\""}},
		{"negative weight", "workers: [{name: a, url: 'http://h:1'}]\nweights: {prefix: -1}", []string{"weights.prefix: negative"}},
		{"misspelt weight", "workers: [{name: a, url: 'http://h:1'}]\nweights: {prefx: 3}", []string{"weights.prefx: unknown key `prefx`; did you mean `prefix`?"}},
		{"bad kind", "workers: [{name: a, url: 'http://h:1', kind: triton}]", []string{"workers[0].kind", "triton"}},
		{"bad duration", "workers: [{name: a, url: 'http://h:1'}]\nadmission: {queue_timeout: soon}", []string{"line 2: admission.queue_timeout: must be a duration", `got "soon"`}},
		{"zero timeout", "workers: [{name: a, url: 'http://h:1'}]\nadmission: {queue_timeout: 0s}", []string{"admission.queue_timeout: must be positive"}},
		{"bad listen", "listen: nowhere\nworkers: [{name: a, url: 'http://h:1'}]", []string{"listen:"}},
		{"store scheme", "workers: [{name: a, url: 'http://h:1'}]\nstats: {store: 'etcd://h:1'}", []string{"stats.store", "redis://"}},
		{"redis db", "workers: [{name: a, url: 'http://h:1'}]\nstats: {store: 'redis://h:6379/x'}", []string{"stats.store", "invalid database"}},
		{"redis option", "workers: [{name: a, url: 'http://h:1'}]\nstats: {store: 'redis://h:6379/0?pool=3'}", []string{"stats.store", "unexpected option: pool"}},
		{"redis no host", "workers: [{name: a, url: 'http://h:1'}]\nstats: {store: 'redis:///0'}", []string{"stats.store", "no host"}},
		{"prefix without redis", "workers: [{name: a, url: 'http://h:1'}]\nstats: {store: s.db, redis_prefix: x}", []string{"stats.redis_prefix", "not a Redis URL"}},
		{"shared redis", "workers: [{name: a, url: 'http://h:1'}]\nshared: {redis: 'redis://h:1/x'}", []string{"shared.redis", "invalid database"}},
		{"shared replica", "workers: [{name: a, url: 'http://h:1'}]\nshared: {redis: 'redis://h:1/0', replica: 'a b', lease_ttl: 10ms, replicas: 0}", []string{"shared.replica", "shared.lease_ttl", "shared.replicas"}},
		{"duplicate class", "workers: [{name: a, url: 'http://h:1'}]\nadmission: {classes: [{name: x}, {name: x}]}", []string{"admission.classes[1].name: duplicate class"}},
		{"no classes", "workers: [{name: a, url: 'http://h:1'}]\nadmission: {classes: []}", []string{"admission.classes: at least one"}},
		{"negative class wait", "workers: [{name: a, url: 'http://h:1'}]\nadmission: {classes: [{name: x, max_queue_wait: -1s}]}", []string{"admission.classes[0].max_queue_wait"}},
		{"tenant weight", "workers: [{name: a, url: 'http://h:1'}]\nadmission: {tenant_weights: {acme: 0}}", []string{"admission.tenant_weights.acme: must be positive"}},
		{"key class", "workers: [{name: a, url: 'http://h:1'}]\nauth: {keys: [{key_sha256: '0000000000000000000000000000000000000000000000000000000000000000', tenant: t, class: gold}]}", []string{"auth.keys[0].class", "gold"}},
		{"several at once", "workers: [{name: '', url: ''}]\nweights: {prefix: -2}", []string{"workers[0].name: missing", "workers[0].url: missing", "weights.prefix"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parse(tt.yaml)
			if err == nil {
				t.Fatal("accepted a bad config")
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

func TestParse_RedisStatsStore(t *testing.T) {
	for _, store := range []string{
		"redis://127.0.0.1:6379/0",
		"redis://:s3cret@redis.internal:6379/2?prefix=prod:",
		"rediss://user:s3cret@redis.internal:6380/0?dial_timeout=2s",
	} {
		yml := "workers: [{name: a, url: 'http://h:1'}]\nstats: {store: '" + store + "'}"
		c, err := parse(yml)
		if err != nil {
			t.Errorf("%s: %v", store, err)
			continue
		}
		if c.Stats.Store != store {
			t.Errorf("stats.store = %q, want %q", c.Stats.Store, store)
		}
	}
}

func TestLoad_ExampleConfigsAreValid(t *testing.T) {
	for _, f := range []string{"sluice.yaml", "bench-demo-limits.yaml", "shared.yaml"} {
		if _, err := Load("../../examples/" + f); err != nil {
			t.Error(err)
		}
	}
}

// FuzzParse holds Check, the decoding Load runs, to two things on any
// input: what it accepts, Validate accepts; and where a strict yaml.v3
// decode (unknown keys refused) of the same text succeeds, Check's own
// decoding, which goes on
// past problems to report them all, gives the same config. Inputs with
// merge keys are left out of the comparison: yaml.v3's order of merged
// keys is its own.
func FuzzParse(f *testing.F) {
	f.Add(good)
	f.Add("workers: [{name: a, url: 'http://h:1'}]")
	f.Add("workers: [{name: a, url: 'http://h:1', max_concurrency: auto, gpu_selector: {gpu: 1}}]\nlimits: {models: {m: {min_stream_tok_s: 3}}}\nadmission: {tenant_weights: {t: 2}, classes: [{name: x, max_queue_wait: 2s}]}")
	f.Add("workers:\n  - &w {name: a, url: 'http://h:1'}\nweights: {latency: ~}\ndiscovery: {kubernetes: {selector: a=b}}\nstats: ~")
	f.Add("workers: [{name: a, url: 'http://h:1', max_concurency: 3}]\nadmission: {queue_timeout: '30'}")
	f.Fuzz(func(t *testing.T, s string) {
		rep := Check("", []byte(s))
		cfg, err := rep.Config, rep.Err()
		if err == nil {
			if verr := cfg.Validate(); verr != nil {
				t.Fatalf("Check accepted a config Validate rejects: %v", verr)
			}
		} else {
			var ps Problems
			if !errors.As(err, &ps) || len(ps) == 0 {
				t.Fatalf("Check failed with %T %v, want Problems", err, err)
			}
		}
		if strings.Contains(s, "<<") {
			return
		}
		strict := DefaultConfig()
		dec := yaml.NewDecoder(strings.NewReader(s))
		dec.KnownFields(true)
		if derr := dec.Decode(&strict); derr != nil && !errors.Is(derr, io.EOF) {
			return
		}
		for i := range strict.Workers {
			if strict.Workers[i].Kind == "" {
				strict.Workers[i].Kind = "llamacpp"
			}
		}
		for _, p := range rep.Problems {
			if strings.HasPrefix(p.Msg, "must be a whole number") || p.Msg == emptyKey || p.Msg == emptyItem {
				return // yaml.v3 cuts 2.5 to 2 and drops empty keys and items; Check refuses them
			}
			if strict.Validate() == nil || !slices.ContainsFunc(strict.Validate().(Problems), func(q *Problem) bool { return q.Key == p.Key && q.Msg == p.Msg }) {
				t.Fatalf("yaml.v3 decodes %q, but Check reports %v", s, p)
			}
		}
		if len(rep.Problems) > 0 {
			return // both refuse it, for the same reasons: no config to compare
		}
		if diff := cmp.Diff(strict, rep.Config); diff != "" {
			t.Fatalf("Check decodes %q differently from yaml.v3 (-yaml.v3 +Check):\n%s", s, diff)
		}
	})
}

func TestParse_MaxConcurrencyAutoOrCap(t *testing.T) {
	tests := []struct {
		in      string
		want    Concurrency
		wantErr string
	}{
		{in: "auto", want: 0},
		{in: "AUTO", want: 0},
		{in: "3", want: 3},
		{in: "many", wantErr: `workers[0].max_concurrency: "many" is neither a whole number nor auto`},
		{in: "-2", wantErr: "workers[0].max_concurrency: negative"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			cfg, err := parse("workers:\n  - {name: a, url: http://127.0.0.1:1, max_concurrency: " + tt.in + "}\n")
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.Workers[0].MaxConcurrency; got != tt.want {
				t.Fatalf("max_concurrency %d, want %d", got, tt.want)
			}
		})
	}
}

func TestParse_LimitsDefaultsAndValidation(t *testing.T) {
	cfg, err := parse("workers:\n  - {name: a, url: http://127.0.0.1:1}\n")
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Limits.Scheduler().Fixed {
		t.Fatal("adaptive concurrency is not the default")
	}
	_, err = parse("workers:\n  - {name: a, url: http://127.0.0.1:1}\nlimits: {policy: decode_first}\n")
	if err == nil || !strings.Contains(err.Error(), "limits.policy: removed") {
		t.Fatalf("limits.policy: decode_first gave %v; want an error saying the key was removed", err)
	}
	_, err = parse(`workers:
  - {name: a, url: "http://127.0.0.1:1"}
limits:
  min_stream_tok_s: -1
  models: {m: {min_stream_tok_s: -3}}
`)
	for _, key := range []string{"limits.min_stream_tok_s", "limits.models.m.min_stream_tok_s"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("error %v does not name %s", err, key)
		}
	}
}

func TestParse_IdleConnTimeoutPerKind(t *testing.T) {
	cfg, err := parse("workers: [{name: a, url: 'http://h:1'}]\nproxy:\n  idle_conn_timeout: {vllm: 2s}\n")
	if err != nil {
		t.Fatal(err)
	}
	for kind, want := range map[string]time.Duration{
		"vllm":     2 * time.Second, // set
		"llamacpp": 4 * time.Second, // under llama-server's 5s keep-alive
		"openai":   DefaultIdleConnTimeout,
		"nonesuch": DefaultIdleConnTimeout,
	} {
		if got := cfg.Proxy.IdleConnTimeoutFor(kind); got != want {
			t.Errorf("%s: %v, want %v", kind, got, want)
		}
	}
	for _, tc := range []struct{ yaml, want string }{
		{"proxy: {idle_conn_timeout: {llamacpp: 0s}}", "proxy.idle_conn_timeout.llamacpp: must be positive"},
		{"proxy: {idle_conn_timeout: {llama: 3s}}", `proxy.idle_conn_timeout.llama: "llama" is not a worker kind`},
	} {
		_, err := parse("workers: [{name: a, url: 'http://h:1'}]\n" + tc.yaml)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q", tc.yaml, err, tc.want)
		}
	}
}

// parse is Load without the file: yaml decoded over DefaultConfig,
// unknown keys refused, then validated; the error is a Problems.
func parse(yaml string) (Config, error) {
	rep := Check("", []byte(yaml))
	if err := rep.Err(); err != nil {
		return Config{}, err
	}
	return rep.Config, nil
}
