// Package config defines Sluice's configuration file: its shape, its
// defaults and its validation. Loading is DefaultConfig, then YAML decoded
// over it with unknown keys rejected, then Validate, which reports every
// problem with its key path at once.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/sluice-router/sluice/internal/fleet"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/redisconn"
	"github.com/sluice-router/sluice/internal/scheduler"
	"github.com/sluice-router/sluice/internal/stats"
)

// Config is the whole configuration of a router.
type Config struct {
	// Listen is the address the router serves on.
	Listen string `yaml:"listen"`
	// LogFormat is "text" or "json".
	LogFormat string `yaml:"log_format"`
	// Policy is the routing policy; empty is Sluice's. Not a
	// configuration key: a router routes by Sluice's score; only the
	// benchmark harness runs a baseline through it, to compare.
	Policy scheduler.Policy `yaml:"-"`
	// Workers are the inference servers behind the router.
	Workers []Worker `yaml:"workers"`
	// Weights are the score weights that are settings: the prefix term's.
	Weights Weights `yaml:"weights"`
	// Admission bounds Sluice's own queue.
	Admission Admission `yaml:"admission"`
	// Stats configures the measured moving averages and their store.
	Stats Stats `yaml:"stats"`
	// Decisions configures the decision log.
	Decisions Decisions `yaml:"decisions"`
	// Telemetry configures health probes and metric scrapes.
	Telemetry Telemetry `yaml:"telemetry"`
	// Proxy configures request handling.
	Proxy Proxy `yaml:"proxy"`
	// Auth configures client API keys and the admin token.
	Auth Auth `yaml:"auth"`
	// Server bounds what one client connection may cost the router.
	Server ServerLimits `yaml:"server"`
	// Shutdown configures what happens on SIGTERM.
	Shutdown Shutdown `yaml:"shutdown"`
	// Shared makes several replicas behind a load balancer schedule the
	// same fleet as one, through shared state in Redis.
	Shared Shared `yaml:"shared"`
	// TLS, when its files are set, serves HTTPS on the listener.
	TLS TLS `yaml:"tls"`
	// Limits configures the adaptive per-worker concurrency limit.
	Limits Limits `yaml:"limits"`
	// Discovery finds workers at run time in addition to Workers.
	Discovery Discovery `yaml:"discovery"`
	// Tracing exports OpenTelemetry spans; off unless OTLPEndpoint is set.
	Tracing Tracing `yaml:"tracing"`
	// Sessions recognises agents' and chat clients' sessions (sessions.go).
	Sessions Sessions `yaml:"sessions"`
	// LoRA configures LoRA adapters (lora.go).
	LoRA LoRA `yaml:"lora"`
}

// Weights are the score's weights an operator sets: the prefix term's
// alone. Every other term keeps its weight of scheduler.DefaultWeights.
type Weights struct {
	// Prefix rewards a worker expected to hold the request's prompt
	// prefix in KV cache; 0 turns prefix-cache affinity off.
	Prefix float64 `yaml:"prefix"`
}

// Scheduler returns the scheduler's weights: its defaults, with the
// prefix term's weight.
func (w Weights) Scheduler() scheduler.Weights {
	sw := scheduler.DefaultWeights()
	sw.Prefix = w.Prefix
	return sw
}

// Limits configures adaptive concurrency (see limit.Config for
// the controller): each worker's limit is learned from the per-stream
// decode rates its requests achieve at each concurrency level, against a
// floor, below the worker's max_concurrency cap.
type Limits struct {
	// MinStreamTokS is the per-stream decode-rate floor in tokens/s; 0
	// derives it from the best solo rate measured.
	MinStreamTokS float64 `yaml:"min_stream_tok_s"`
	// Learning is the rest of the controller's settings, which are not
	// configuration keys: DefaultConfig's values are the router's one
	// behaviour. Only a router run on a faster clock than the fleet it
	// models (the simulation harness) scales its durations.
	Learning limit.Config `yaml:"-"`
	// Models sets per-model targets.
	Models map[string]ModelTargets `yaml:"models"`
}

// StatsMemory is the stats.store that keeps the averages in memory only.
const StatsMemory = "memory"

// DefaultStatsStore returns where `sluice serve` keeps the averages when
// stats.store is not set: stats.db in $SLUICE_STATE_DIR, else in
// $XDG_STATE_HOME/sluice, else in ~/.local/state/sluice (the container
// image sets SLUICE_STATE_DIR=/var/lib/sluice). The averages persist by
// default so that a worker known to be slow is still known slow after a
// restart; memory only is an explicit choice.
func DefaultStatsStore() (string, error) {
	dir := os.Getenv("SLUICE_STATE_DIR")
	if dir == "" {
		if x := os.Getenv("XDG_STATE_HOME"); x != "" {
			dir = filepath.Join(x, "sluice")
		} else {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("stats.store is not set and there is no home directory for its default (set stats.store, SLUICE_STATE_DIR, or stats.store: memory): %w", err)
			}
			dir = filepath.Join(home, ".local", "state", "sluice")
		}
	}
	return filepath.Join(dir, "stats.db"), nil
}

// ModelTargets are one model's targets.
type ModelTargets struct {
	// MinStreamTokS is the model's per-stream decode-rate floor.
	MinStreamTokS float64 `yaml:"min_stream_tok_s"`
}

// Scheduler returns the scheduler's view of the limits.
func (l Limits) Scheduler() limit.Config {
	lc := l.Learning
	lc.MinStreamTokS, lc.ModelFloors = l.MinStreamTokS, nil
	for m, t := range l.Models {
		if t.MinStreamTokS > 0 {
			if lc.ModelFloors == nil {
				lc.ModelFloors = map[string]float64{}
			}
			lc.ModelFloors[m] = t.MinStreamTokS
		}
	}
	return lc
}

// Tracing configures OpenTelemetry tracing of proxied requests.
type Tracing struct {
	// OTLPEndpoint is an OTLP/HTTP collector's base URL, e.g.
	// http://otel-collector:4318; empty turns tracing off.
	OTLPEndpoint string `yaml:"otlp_endpoint"`
	// ServiceName is the service.name of the spans.
	ServiceName string `yaml:"service_name"`
	// SampleRatio is the share of new traces recorded, in (0, 1]; a
	// request whose client sampled its trace is always recorded.
	SampleRatio float64 `yaml:"sample_ratio"`
}

// Discovery configures where workers are found besides the static list.
type Discovery struct {
	// Kubernetes, when set, follows the EndpointSlices of the workers'
	// Service: ready endpoints become workers, others are removed.
	Kubernetes *KubernetesDiscovery `yaml:"kubernetes"`
}

// KubernetesDiscovery selects the EndpointSlices whose endpoints are
// workers.
type KubernetesDiscovery struct {
	// Namespace holds the slices; empty is the router's own namespace.
	Namespace string `yaml:"namespace"`
	// Selector is a label selector on the slices, e.g.
	// "kubernetes.io/service-name=vllm" (every slice carries its
	// Service's name in that label).
	Selector string `yaml:"selector"`
	// PortName picks the slice port to send requests to; empty takes the
	// slice's only port.
	PortName string `yaml:"port_name"`
	// Kind, Models and MaxConcurrency apply to every discovered worker,
	// as in a workers entry; Kind defaults to llamacpp.
	Kind           string      `yaml:"kind"`
	Models         []string    `yaml:"models"`
	MaxConcurrency Concurrency `yaml:"max_concurrency"`
}

// Worker is one inference server.
type Worker struct {
	// Name identifies the worker in headers, records and metrics.
	Name string `yaml:"name" json:"name,omitempty"`
	// URL is the worker's base URL, e.g. http://10.0.0.5:8080.
	URL string `yaml:"url" json:"url,omitempty"`
	// Kind is "llamacpp" (default), "vllm", "sglang", "tgi", "trtllm",
	// "ollama" or "openai"; it selects which health and metrics endpoints
	// are read.
	Kind string `yaml:"kind" json:"kind,omitempty"`
	// Models the worker serves. May be left out: models are discovered
	// from /v1/models.
	Models []string `yaml:"models" json:"models,omitempty"`
	// MaxConcurrency caps Sluice's in-flight requests on the worker:
	// "auto" (the default, also 0 or unset) learns the limit below the
	// slot count the worker reports (else a cap of 64); a number is a cap
	// the learned limit stays under.
	MaxConcurrency Concurrency `yaml:"max_concurrency" json:"max_concurrency,omitempty"`
	// GPUMetrics is an optional NVIDIA DCGM exporter /metrics URL.
	GPUMetrics string `yaml:"gpu_metrics" json:"gpu_metrics,omitempty"`
	// GPUSelector picks one GPU of an exporter serving several, by label,
	// e.g. {gpu: "1"} or {UUID: "GPU-..."}.
	GPUSelector map[string]string `yaml:"gpu_selector" json:"gpu_selector,omitempty"`
	// TLSCAFile is a PEM file of CAs that sign an https worker's
	// certificate, in place of the system roots.
	TLSCAFile string `yaml:"tls_ca_file" json:"tls_ca_file,omitempty"`
	// TLSInsecureSkipVerify turns off certificate checks for an https
	// worker. Off by default; only for workers on a trusted network.
	TLSInsecureSkipVerify bool `yaml:"tls_insecure_skip_verify" json:"tls_insecure_skip_verify,omitempty"`
	// APIKey is the worker's own API key (llama-server --api-key, vLLM
	// --api-key), sent as "Authorization: Bearer" on probes and proxied
	// requests. At most one of APIKey, APIKeyEnv and APIKeyFile is set.
	// It is a secret: never logged, never shown by the HTTP API.
	APIKey string `yaml:"api_key" json:"api_key,omitempty"`
	// APIKeyEnv names an environment variable holding the key.
	APIKeyEnv string `yaml:"api_key_env" json:"api_key_env,omitempty"`
	// APIKeyFile is a file holding the key (surrounding space trimmed).
	APIKeyFile string `yaml:"api_key_file" json:"api_key_file,omitempty"`
	// ForwardClientAuth passes the client's Authorization header on to the
	// worker when the worker has no key of its own. Off by default: a
	// client's credentials are not the worker's business.
	ForwardClientAuth bool `yaml:"forward_client_auth" json:"forward_client_auth,omitempty"`
	// KVEvents is the vLLM worker's KV-cache event publisher
	// (--kv-events-config endpoint), tcp://host:port; empty: none.
	// KVEventsReplay is its replay endpoint, asked for missed batches.
	KVEvents       string `yaml:"kv_events" json:"kv_events,omitempty"`
	KVEventsReplay string `yaml:"kv_events_replay" json:"kv_events_replay,omitempty"`
}

// ResolveAPIKey returns the worker's API key from wherever the config
// says it is, or "" when it has none.
func (w Worker) ResolveAPIKey() (string, error) {
	switch {
	case w.APIKey != "":
		return w.APIKey, nil
	case w.APIKeyEnv != "":
		v := strings.TrimSpace(os.Getenv(w.APIKeyEnv))
		if v == "" {
			return "", fmt.Errorf("environment variable %s is unset or empty", w.APIKeyEnv)
		}
		return v, nil
	case w.APIKeyFile != "":
		b, err := os.ReadFile(w.APIKeyFile)
		if err != nil {
			return "", fmt.Errorf("read key: %w", err)
		}
		v := strings.TrimSpace(string(b))
		if v == "" {
			return "", fmt.Errorf("%s is empty", w.APIKeyFile)
		}
		return v, nil
	}
	return "", nil
}

// MarshalJSON writes the worker with its literal API key redacted, so no
// listing or record can leak it.
func (w Worker) MarshalJSON() ([]byte, error) {
	type plain Worker
	if w.APIKey != "" {
		w.APIKey = "REDACTED"
	}
	return json.Marshal(plain(w))
}

// LogValue logs the worker without its API key.
func (w Worker) LogValue() slog.Value {
	return slog.GroupValue(slog.String("name", w.Name), slog.String("url", w.URL), slog.String("kind", w.Kind),
		slog.Bool("api_key_set", w.APIKey != "" || w.APIKeyEnv != "" || w.APIKeyFile != ""))
}

// Concurrency is a worker's max_concurrency: a positive cap, or 0 for
// "auto". In YAML and JSON it is a number or the word auto.
type Concurrency int

// UnmarshalYAML accepts a number or "auto".
func (c *Concurrency) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode && strings.EqualFold(n.Value, "auto") {
		*c = 0
		return nil
	}
	var v int
	if err := n.Decode(&v); err != nil {
		return fmt.Errorf("%q is neither a whole number nor auto", n.Value)
	}
	*c = Concurrency(v)
	return nil
}

// UnmarshalJSON accepts a number or "auto".
func (c *Concurrency) UnmarshalJSON(b []byte) error {
	if s := strings.Trim(string(b), `"`); strings.EqualFold(s, "auto") {
		*c = 0
		return nil
	}
	var v int
	if err := json.Unmarshal(b, &v); err != nil {
		return fmt.Errorf("max_concurrency: %s is neither a number nor \"auto\"", b)
	}
	*c = Concurrency(v)
	return nil
}

// MarshalYAML writes auto for 0.
func (c Concurrency) MarshalYAML() (any, error) {
	if c == 0 {
		return "auto", nil
	}
	return int(c), nil
}

// Admission bounds the queue.
type Admission struct {
	// MaxQueue is the most requests that may wait per model.
	MaxQueue int `yaml:"max_queue"`
	// QueueTimeout is the longest a request waits before a 503.
	QueueTimeout time.Duration `yaml:"queue_timeout"`
	// Classes are the priority classes a request names in
	// X-Sluice-Priority, the first the default: strict priority (lower
	// first), bounded by the queue's aging bound, each with its own
	// deadline.
	Classes []scheduler.Class `yaml:"classes"`
	// TenantWeights are the fair-share weights of tenants by name; a
	// tenant not listed weighs 1.
	TenantWeights map[string]float64 `yaml:"tenant_weights"`
	// MaxOvertake is the aging bound of the queue order: no request is
	// overtaken by a higher class, or by a request whose prompt prefix
	// the freed worker holds, that arrived more than this after it. Not a
	// configuration key: DefaultConfig's value is the router's one
	// behaviour; only a router run on a faster clock than the fleet it
	// models (the simulation harness) scales it.
	MaxOvertake time.Duration `yaml:"-"`
	// KVFit passes over a worker whose KV cache cannot take a request's
	// prompt now, and holds the request in the queue when none can; on
	// by default (see scheduler.Config.KVFit).
	KVFit bool `yaml:"kv_fit"`
	// SLO is each priority class's service-level objective, by class
	// name: its time to first token (ttft plus ttft_per_1k_prompt_tokens
	// per 1,000 prompt tokens not expected to be cached), its per-stream
	// decode floor and what to do when it is predicted to be missed. A
	// field left out, and a class left out, take the default derived from
	// what the fleet does unloaded (predict.DefaultSLO). It is a map
	// beside admission.classes rather than a key of each class because
	// the class type belongs to package scheduler.
	SLO map[string]predict.SLO `yaml:"slo"`
	// Mode is how workers are judged for a request: "limits", by their
	// learned concurrency limits, or "slo", by the predicted promise (its
	// first token within the SLO's objective without any stream below the
	// floor; see scheduler.AdmitBySLO).
	Mode string `yaml:"mode"`
	// FairShareBy is the fair-share flow of the queue: "tenant" (the
	// default: each tenant shares with the others) or "session" (each
	// session is a flow of its own within its tenant's share, so one
	// agent's burst does not hold back another's, and more sessions do
	// not make a bigger share; see sessions).
	FairShareBy string `yaml:"fair_share_by"`
}

// Stats configures the moving averages.
type Stats struct {
	// Store is where averages persist: a file path (embedded bbolt
	// store), a redis:// or rediss:// URL (shared by every replica
	// pointing at it: redis://[:password@]host:port/db, which then also
	// shares the prefix index unless Shared.Redis is set), or "memory"
	// for memory only. `sluice serve` persists by default: unset, it is
	// DefaultStatsStore. Empty here (as built in code) is memory.
	Store string `yaml:"store"`
	// RedisPrefix starts every Redis key when Store is a Redis URL;
	// overrides the URL's prefix parameter. Default "sluice:".
	RedisPrefix string `yaml:"redis_prefix"`
	// FlushInterval is how often changed averages are written. Not a
	// configuration key: DefaultConfig's stats.FlushInterval is the
	// router's one behaviour; only a router run on a faster clock than
	// the fleet it models (the simulation harness) scales it.
	FlushInterval time.Duration `yaml:"-"`
}

// Shared configures state shared between replicas.
type Shared struct {
	// Redis is the redis:// or rediss:// URL of the shared state (the
	// reservation ledger and the prefix index); empty (the default) runs
	// this replica alone.
	Redis string `yaml:"redis"`
	// Replica names this replica, unique among those sharing Redis; the
	// host name and listen port ("host-8080") when empty.
	Replica string `yaml:"replica"`
	// LeaseTTL is how long a reservation outlives its replica: the
	// longest a crashed replica's capacity stays taken.
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	// Replicas is how many replicas share the fleet; while Redis is down
	// each schedules on its own with limit/replicas (at least 1) of
	// every worker.
	Replicas int `yaml:"replicas"`
}

// Decisions configures the decision log.
type Decisions struct {
	// RingSize is how many recent records /debug/decisions keeps.
	RingSize int `yaml:"ring_size"`
	// File, when set, receives every record as one JSON line.
	File string `yaml:"file"`
}

// Telemetry configures probing and scraping of workers.
type Telemetry struct {
	// Interval between scrapes of each worker.
	Interval time.Duration `yaml:"interval"`
	// Timeout of each probe or scrape.
	Timeout time.Duration `yaml:"timeout"`
	// StaleAfter marks telemetry older than this as stale.
	StaleAfter time.Duration `yaml:"stale_after"`
	// FailThreshold is how many failed probes or requests in a row eject
	// a worker.
	FailThreshold int `yaml:"fail_threshold"`
}

// Proxy configures request handling.
type Proxy struct {
	// MaxBodyBytes bounds a request body; larger ones get 413.
	MaxBodyBytes int64 `yaml:"max_body_bytes"`
	// MaxAttempts is how many workers a request may be tried on when
	// they fail before sending anything.
	MaxAttempts int `yaml:"max_attempts"`
	// ResponseHeaderTimeout bounds the wait for a worker's response
	// headers (which for a non-streaming request come with the answer).
	ResponseHeaderTimeout time.Duration `yaml:"response_header_timeout"`
	// StreamIdleTimeout bounds how long a read of a worker's answer may
	// wait once its headers came: a worker that stalls
	// mid-answer is cut off, its slot freed and the failure counted.
	StreamIdleTimeout time.Duration `yaml:"stream_idle_timeout"`
	// IdleConnTimeout is, per worker kind, how long a keep-alive
	// connection to a worker may sit idle in Sluice's pool before Sluice
	// closes it. It must be shorter than the worker's own keep-alive
	// timeout, or Sluice sends requests on connections the worker has
	// just closed. Kinds left out keep their default (DefaultIdleConnTimeouts).
	IdleConnTimeout map[string]time.Duration `yaml:"idle_conn_timeout"`
	// MaxContinuations is how many times one stream may be continued on
	// another worker after its worker broke it mid-way (an error, a cut
	// connection, stream_idle_timeout of silence, a drain deadline); 0
	// never continues, and the stream ends with an error event.
	MaxContinuations int `yaml:"max_continuations"`
	// DrainDeadline is how long a worker removed from the fleet (a config
	// reload, an EndpointSlice endpoint terminating, the admin API) keeps
	// its streams before they are continued on other workers.
	DrainDeadline time.Duration `yaml:"drain_deadline"`
}

// DefaultIdleConnTimeout is the idle-connection timeout of a kind whose
// server's keep-alive timeout is not known: Go's http.DefaultTransport's.
const DefaultIdleConnTimeout = 90 * time.Second

// DefaultIdleConnTimeouts returns the idle-connection timeouts per worker
// kind: 4s for the servers known to close idle connections after 5s —
// llama-server (cpp-httplib's CPPHTTPLIB_KEEPALIVE_TIMEOUT_SECOND, sent as
// "Keep-Alive: timeout=5"), vLLM (VLLM_HTTP_TIMEOUT_KEEP_ALIVE, default 5)
// and the other uvicorn servers, SGLang and trtllm-serve (uvicorn's
// timeout_keep_alive, default 5) — and DefaultIdleConnTimeout for the rest
// (TGI and Ollama keep idle connections open; an OpenAI-compatible server
// may be anything).
func DefaultIdleConnTimeouts() map[string]time.Duration {
	out := map[string]time.Duration{}
	for _, k := range fleet.Kinds {
		out[k] = DefaultIdleConnTimeout
	}
	for _, k := range []string{fleet.KindLlamaCPP, fleet.KindVLLM, fleet.KindSGLang, fleet.KindTRTLLM} {
		out[k] = 4 * time.Second
	}
	return out
}

// IdleConnTimeoutFor returns the idle-connection timeout of a worker
// kind: the configured one, else its default.
func (p Proxy) IdleConnTimeoutFor(kind string) time.Duration {
	if d, ok := p.IdleConnTimeout[kind]; ok && d > 0 {
		return d
	}
	if d, ok := DefaultIdleConnTimeouts()[kind]; ok {
		return d
	}
	return DefaultIdleConnTimeout
}

// Auth configures who may call the router. With no keys the inference
// routes are open; with no admin token the admin routes answer loopback
// clients only.
type Auth struct {
	// Keys are the client API keys, sent as "Authorization: Bearer <key>".
	Keys []APIKey `yaml:"keys"`
	// AdminTokenSHA256 is the hex SHA-256 of the admin bearer token.
	AdminTokenSHA256 string `yaml:"admin_token_sha256"`
	// AdminTokenFile is a file holding the admin token itself (a mounted
	// secret); it is hashed when read and the plain token dropped.
	AdminTokenFile string `yaml:"admin_token_file"`
}

// APIKey is one client API key. Only its SHA-256 is kept in memory.
type APIKey struct {
	// KeySHA256 is the hex SHA-256 of the key (sha256sum of the key
	// without a newline).
	KeySHA256 string `yaml:"key_sha256"`
	// KeyFile is a file holding the key itself; surrounding whitespace
	// is ignored.
	KeyFile string `yaml:"key_file"`
	// Tenant names who the key belongs to; it goes into every request's
	// scheduling and fair share.
	Tenant string `yaml:"tenant"`
	// Class is the key's priority class (e.g. interactive, batch); empty
	// takes the default class.
	Class string `yaml:"class"`
	// Rate is the most requests per second the key may start; 0 is
	// unlimited. Bursts of up to max(1, Rate) requests pass at once.
	Rate float64 `yaml:"rate"`
	// MaxConcurrent is the most requests the key may have open at once;
	// 0 is unlimited.
	MaxConcurrent int `yaml:"max_concurrent"`
	// SLO overrides, field by field, the SLO of the key's class for its
	// requests; a field left out takes the class's.
	SLO predict.SLO `yaml:"slo"`
	// Continue, when false, never continues the key's streams on another
	// worker when theirs breaks (proxy.max_continuations); unset is true.
	Continue *bool `yaml:"continue"`
}

// ServerLimits bound what one client or connection may cost.
type ServerLimits struct {
	// MaxHeaderBytes bounds a request's header block; larger ones get 431.
	MaxHeaderBytes int `yaml:"max_header_bytes"`
	// ReadHeaderTimeout is how long a client may take to send its headers
	// (slowloris protection); the connection is closed after it.
	ReadHeaderTimeout time.Duration `yaml:"read_header_timeout"`
	// IdleTimeout closes a keep-alive connection idle this long.
	IdleTimeout time.Duration `yaml:"idle_timeout"`
	// MaxConnections bounds the open client connections; 0 (the default)
	// is half of the process's open-file limit once 128 files are kept
	// for the router itself, so that it never runs out of files to reach
	// its workers with. Connections beyond it wait in the kernel's accept
	// backlog until one closes (and are refused by the kernel once the
	// backlog is full).
	MaxConnections int `yaml:"max_connections"`
}

// Shutdown configures the graceful stop on SIGTERM.
type Shutdown struct {
	// DrainDelay is how long /readyz answers 503 while Sluice still
	// serves, so a load balancer takes it out of rotation first.
	DrainDelay time.Duration `yaml:"drain_delay"`
	// Grace is how long queued and in-flight requests may then finish;
	// requests still queued at its end get 503 shutting_down.
	Grace time.Duration `yaml:"grace"`
}

// TLS configures HTTPS on the listener. The files are re-read when they
// change, so a renewed certificate needs no restart.
type TLS struct {
	// CertFile is the PEM certificate chain.
	CertFile string `yaml:"cert_file"`
	// KeyFile is the PEM private key.
	KeyFile string `yaml:"key_file"`
}

// DefaultConfig returns the configuration used for every key left out.
func DefaultConfig() Config {
	return Config{
		Listen:    "127.0.0.1:8080",
		LogFormat: "text",
		Weights:   Weights{Prefix: scheduler.DefaultWeights().Prefix},
		Admission: Admission{MaxQueue: 256, QueueTimeout: 30 * time.Second, Classes: scheduler.DefaultClasses(), MaxOvertake: scheduler.DefaultMaxOvertake, KVFit: true, Mode: scheduler.AdmitByLimits, FairShareBy: FairShareByTenant},
		Stats:     Stats{FlushInterval: stats.FlushInterval},
		Decisions: Decisions{RingSize: 1024},
		Telemetry: Telemetry{Interval: time.Second, Timeout: time.Second, StaleAfter: 3 * time.Second, FailThreshold: 3},
		Proxy: Proxy{MaxBodyBytes: 8 << 20, MaxAttempts: 2, ResponseHeaderTimeout: 10 * time.Minute, StreamIdleTimeout: time.Minute, IdleConnTimeout: DefaultIdleConnTimeouts(),
			MaxContinuations: 1, DrainDeadline: 30 * time.Second},
		Server:   ServerLimits{MaxHeaderBytes: 64 << 10, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute},
		Shutdown: Shutdown{DrainDelay: 5 * time.Second, Grace: 30 * time.Second},
		Shared:   Shared{LeaseTTL: 5 * time.Second, Replicas: 1},
		Sessions: Sessions{Affinity: true, Headers: slices.Clone(DefaultSessionHeaders), TTL: 30 * time.Minute, MaxSessions: 65536},
		Limits: Limits{Learning: limit.Config{FloorFraction: 0.5, MinSamples: 3, ProbeAfter: time.Minute,
			BorrowAfter: 2 * time.Second, DefaultCap: 64}},
		Tracing: Tracing{ServiceName: "sluice", SampleRatio: 1},
		LoRA:    LoRA{MaxReplicas: lora.DefaultReplicas, LoadTimeout: lora.DefaultLoadTimeout},
	}
}

// Load reads, decodes and validates the file at path. Its error is a
// Problems naming the file, with every problem found, or the reason the
// file could not be read.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config: %w", err)
	}
	r := Check(path, data)
	if err := r.Err(); err != nil {
		return Config{}, err
	}
	return r.Config, nil
}

// Validate reports every problem in cfg, each with its key path: nil, or
// a Problems.
func (c *Config) Validate() error {
	if ps := c.problems(); len(ps) > 0 {
		return ps
	}
	return nil
}

// problems is every problem in c, each with its key path.
func (c *Config) problems() Problems {
	var errs Problems
	bad := errs.add
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("listen", "%q is not host:port: %v", c.Listen, err)
	}
	if c.LogFormat != "text" && c.LogFormat != "json" {
		bad("log_format", "%q is not text or json", c.LogFormat)
	}
	if len(c.Workers) == 0 && c.Discovery.Kubernetes == nil {
		bad("workers", "at least one worker is needed (or discovery.kubernetes)")
	}
	seen := map[string]int{}
	for i, w := range c.Workers {
		key := fmt.Sprintf("workers[%d]", i)
		errs = append(errs, w.Validate(key)...)
		if j, dup := seen[w.Name]; dup && w.Name != "" {
			bad(key+".name", "duplicate worker name %q (also workers[%d])", w.Name, j)
		}
		seen[w.Name] = i
	}
	if c.Weights.Prefix < 0 {
		bad("weights.prefix", "negative weight %v (the term is already a reward; 0 turns it off)", c.Weights.Prefix)
	}
	if m := c.Admission.Mode; m != scheduler.AdmitByLimits && m != scheduler.AdmitBySLO {
		bad("admission.mode", "unknown mode %q (limits or slo)", m)
	}
	if c.Admission.MaxQueue < 0 {
		bad("admission.max_queue", "negative (%d)", c.Admission.MaxQueue)
	}
	c.validateSessions(bad)
	positive(bad, "admission.queue_timeout", c.Admission.QueueTimeout)
	if len(c.Admission.Classes) == 0 {
		bad("admission.classes", "at least one class is needed")
	}
	classSeen := map[string]int{}
	var classNames []string
	for i, cl := range c.Admission.Classes {
		classNames = append(classNames, cl.Name)
		key := fmt.Sprintf("admission.classes[%d]", i)
		if j, dup := classSeen[cl.Name]; dup {
			bad(key+".name", "duplicate class %q (also admission.classes[%d])", cl.Name, j)
		}
		classSeen[cl.Name] = i
		if cl.Name == "" || strings.ContainsAny(cl.Name, " \t\n\"") {
			bad(key+".name", "%q must be a non-empty word", cl.Name)
		}
		if cl.MaxQueueWait < 0 {
			bad(key+".max_queue_wait", "negative (%v); 0 takes admission.queue_timeout", cl.MaxQueueWait)
		}
	}
	for i, k := range c.Auth.Keys {
		if _, ok := classSeen[k.Class]; k.Class != "" && !ok {
			bad(fmt.Sprintf("auth.keys[%d].class", i), "%q is not one of admission.classes", k.Class)
		}
		for _, p := range k.SLO.Problems() {
			bad(fmt.Sprintf("auth.keys[%d].slo.%s", i, p.Key), "%s", p.Msg)
		}
	}
	for _, name := range slices.Sorted(maps.Keys(c.Admission.SLO)) {
		key := "admission.slo." + name
		if _, ok := classSeen[name]; !ok {
			bad(key, "%s", didYouMean(fmt.Sprintf("%q is not one of admission.classes (%s)", name, strings.Join(classNames, ", ")), name, classNames))
		}
		for _, p := range c.Admission.SLO[name].Problems() {
			bad(key+"."+p.Key, "%s", p.Msg)
		}
	}
	for name, w := range c.Admission.TenantWeights {
		positive(bad, "admission.tenant_weights."+name, w)
	}
	c.LoRA.validate(c.Workers, bad)
	if redisconn.IsURL(c.Stats.Store) {
		if _, _, err := redisconn.Parse(c.Stats.Store, c.Stats.RedisPrefix); err != nil {
			bad("stats.store", "%v", err)
		}
	} else if strings.Contains(c.Stats.Store, "://") {
		bad("stats.store", "%q: a file path, or a redis:// or rediss:// URL", redisconn.Redact(c.Stats.Store))
	} else if c.Stats.RedisPrefix != "" {
		bad("stats.redis_prefix", "set but stats.store %q is not a Redis URL", c.Stats.Store)
	}
	positive(bad, "decisions.ring_size", c.Decisions.RingSize)
	t := c.Telemetry
	positive(bad, "telemetry.interval", t.Interval)
	positive(bad, "telemetry.timeout", t.Timeout)
	if t.StaleAfter < t.Interval {
		bad("telemetry.stale_after", "%v is shorter than telemetry.interval %v: every reading would be stale", t.StaleAfter, t.Interval)
	}
	if t.FailThreshold < 1 {
		bad("telemetry.fail_threshold", "must be at least 1, got %d", t.FailThreshold)
	}
	positive(bad, "proxy.max_body_bytes", c.Proxy.MaxBodyBytes)
	if c.Proxy.MaxAttempts < 1 {
		bad("proxy.max_attempts", "must be at least 1, got %d", c.Proxy.MaxAttempts)
	}
	if c.Proxy.MaxContinuations < 0 {
		bad("proxy.max_continuations", "must not be negative (0 turns continuation off), got %d", c.Proxy.MaxContinuations)
	}
	positive(bad, "proxy.drain_deadline", c.Proxy.DrainDeadline)
	if sh := c.Shared; sh.Redis != "" {
		if _, _, err := redisconn.Parse(sh.Redis, ""); err != nil {
			bad("shared.redis", "%v", err)
		}
		if strings.ContainsAny(sh.Replica, "|/ \t\n") {
			bad("shared.replica", "%q must not contain spaces, '|' or '/'", sh.Replica)
		}
		if sh.LeaseTTL < 500*time.Millisecond {
			bad("shared.lease_ttl", "%v is too short to renew in time (at least 500ms)", sh.LeaseTTL)
		}
		if sh.Replicas < 1 {
			bad("shared.replicas", "must be at least 1, got %d", sh.Replicas)
		}
	}
	positive(bad, "proxy.response_header_timeout", c.Proxy.ResponseHeaderTimeout)
	positive(bad, "proxy.stream_idle_timeout", c.Proxy.StreamIdleTimeout)
	for _, kind := range slices.Sorted(maps.Keys(c.Proxy.IdleConnTimeout)) {
		key := "proxy.idle_conn_timeout." + kind
		if !slices.Contains(fleet.Kinds, kind) {
			bad(key, "%q is not a worker kind (one of %s)", kind, oneOf(fleet.Kinds))
		}
		positive(bad, key, c.Proxy.IdleConnTimeout[kind])
	}
	c.validateHardening(bad)
	l := c.Limits
	if l.MinStreamTokS < 0 {
		bad("limits.min_stream_tok_s", "negative (%v); 0 derives the floor from the best solo rate", l.MinStreamTokS)
	}
	for m, t := range l.Models {
		if strings.TrimSpace(m) == "" {
			bad("limits.models", "empty model name")
		}
		if t.MinStreamTokS < 0 {
			bad("limits.models."+m+".min_stream_tok_s", "negative (%v)", t.MinStreamTokS)
		}
	}
	if t := c.Tracing; t.OTLPEndpoint != "" {
		if err := checkURL(t.OTLPEndpoint); err != nil {
			bad("tracing.otlp_endpoint", "%v", err)
		}
		if t.SampleRatio <= 0 || t.SampleRatio > 1 {
			bad("tracing.sample_ratio", "%v is outside (0, 1]", t.SampleRatio)
		}
		if strings.TrimSpace(t.ServiceName) == "" {
			bad("tracing.service_name", "empty")
		}
	}
	if k := c.Discovery.Kubernetes; k != nil {
		k.validate(bad)
	}
	return errs
}

// nearest returns the word of words close enough to name to be taken for
// a typo of it, or "".
func nearest(name string, words []string) string {
	best, bestD := "", 0
	for _, w := range words {
		if d := editDistance(strings.ToLower(name), strings.ToLower(w)); best == "" || d < bestD {
			best, bestD = w, d
		}
	}
	if best != "" && bestD <= typoDistance(name) {
		return best
	}
	return ""
}

// didYouMean is msg, about name, with the word of words it is a typo of,
// if any.
func didYouMean(msg, name string, words []string) string {
	if near := nearest(name, words); near != "" {
		msg += fmt.Sprintf("; did you mean `%s`?", near)
	}
	return msg
}

// oneOf lists the allowed words, comma separated.
func oneOf[S ~string](words []S) string {
	out := make([]string, len(words))
	for i, w := range words {
		out[i] = string(w)
	}
	return strings.Join(out, ", ")
}

// Validate reports every problem with the worker, each under key (its
// path, e.g. workers[0]).
func (w Worker) Validate(key string) Problems {
	var errs Problems
	bad := under(errs.add, key)
	if w.Name == "" {
		bad("name", "missing")
	} else if strings.ContainsAny(w.Name, " \t\n/\"") {
		bad("name", "%q must not contain spaces, quotes or slashes", w.Name)
	}
	if err := checkURL(w.URL); err != nil {
		bad("url", "%v", err)
	}
	if !slices.Contains(fleet.Kinds, w.Kind) {
		bad("kind", "%q is not one of %s", w.Kind, oneOf(fleet.Kinds))
	}
	validateModels(bad, w.Models)
	if w.MaxConcurrency < 0 {
		bad("max_concurrency", "negative (%d); use a positive cap or auto", w.MaxConcurrency)
	}
	if w.GPUMetrics != "" {
		if err := checkURL(w.GPUMetrics); err != nil {
			bad("gpu_metrics", "%v", err)
		}
	} else if len(w.GPUSelector) > 0 {
		bad("gpu_selector", "set without gpu_metrics")
	}
	if w.KVEvents != "" {
		if err := checkZMQ(w.KVEvents); err != nil {
			bad("kv_events", "%v", err)
		}
	}
	if w.KVEventsReplay != "" {
		if w.KVEvents == "" {
			bad("kv_events_replay", "set without kv_events")
		} else if err := checkZMQ(w.KVEventsReplay); err != nil {
			bad("kv_events_replay", "%v", err)
		}
	}
	if (w.TLSCAFile != "" || w.TLSInsecureSkipVerify) && !strings.HasPrefix(w.URL, "https://") {
		bad("tls_ca_file", "TLS settings need an https url, got %q", w.URL)
	}
	if w.TLSCAFile != "" && w.TLSInsecureSkipVerify {
		bad("tls_insecure_skip_verify", "set with tls_ca_file: a CA file is pointless when nothing is verified")
	}
	set := 0
	for _, v := range []string{w.APIKey, w.APIKeyEnv, w.APIKeyFile} {
		if v != "" {
			set++
		}
	}
	switch {
	case set > 1:
		bad("api_key", "set at most one of api_key, api_key_env and api_key_file")
	case w.APIKeyEnv != "":
		if _, err := w.ResolveAPIKey(); err != nil {
			bad("api_key_env", "%v", err)
		}
	case w.APIKeyFile != "":
		if _, err := w.ResolveAPIKey(); err != nil {
			bad("api_key_file", "%v", err)
		}
	}
	return errs
}

func checkURL(s string) error {
	if s == "" {
		return errors.New("missing")
	}
	if l := strings.ToLower(s); !strings.Contains(s, "://") && !strings.HasPrefix(l, "http:") && !strings.HasPrefix(l, "https:") {
		// "127.0.0.1:8081" would otherwise be refused in url.Parse's
		// words ("first path segment in URL cannot contain colon"), and
		// "gpu1:8000" as a URL of scheme "gpu1".
		return fmt.Errorf("%q has no scheme; add http:// (or https://)", s)
	}
	u, err := url.Parse(s)
	if err != nil {
		return fmt.Errorf("%q: %v", s, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%q: scheme must be http or https", s)
	}
	if u.Host == "" {
		return fmt.Errorf("%q: no host", s)
	}
	return nil
}

// validate checks what can be checked without a cluster; the selector's
// syntax is checked when discovery starts (and by sluice config check).
func (k *KubernetesDiscovery) validate(bad report) {
	bad = under(bad, "discovery.kubernetes")
	if strings.TrimSpace(k.Selector) == "" {
		bad("selector", "missing: without one every EndpointSlice of the namespace would become workers")
	}
	if k.Kind != "" && !slices.Contains(fleet.Kinds, k.Kind) {
		bad("kind", "%q is not one of %s", k.Kind, oneOf(fleet.Kinds))
	}
	validateModels(bad, k.Models)
	if k.MaxConcurrency < 0 {
		bad("max_concurrency", "negative (%d); use a positive cap or auto", k.MaxConcurrency)
	}
}

// validateModels reports the empty names of a models list.
func validateModels(bad report, models []string) {
	for i, m := range models {
		if strings.TrimSpace(m) == "" {
			bad(fmt.Sprintf("models[%d]", i), "empty model name")
		}
	}
}

// report records one problem under its key path.
type report = func(key, format string, args ...any)

// under returns bad with every key put under prefix.
func under(bad report, prefix string) report {
	return func(key, format string, args ...any) { bad(prefix+"."+key, format, args...) }
}

// positive reports v under key unless it is positive.
func positive[T int | int64 | float64 | time.Duration](bad report, key string, v T) {
	if v <= 0 {
		bad(key, "must be positive, got %v", v)
	}
}
