package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// WorkerSpec describes one worker of a fleet.
type WorkerSpec struct {
	// Name identifies the worker (logs, DCGM Hostname label).
	Name string
	// Params are its engine parameters.
	Params Params
	// TimeScale is the worker's Options.TimeScale; 0 means 1.
	TimeScale float64
	// KVEvents and KVEventsReplay are its Options.KVEvents and
	// KVEventsReplay (host:port): where it publishes its KV-cache events.
	KVEvents, KVEventsReplay string
}

// Worker is one running member of a Fleet.
type Worker struct {
	// Name is the spec's name; URL the base URL it listens on
	// ("http://127.0.0.1:8081").
	Name string
	URL  string
	// Server is the simulated llama-server, for Ready, Metrics and Params.
	Server *Server
	http   *http.Server
}

// Fleet is a set of simulated workers listening on loopback ports in one
// process.
type Fleet struct {
	workers []*Worker
	once    sync.Once
	wg      sync.WaitGroup
	stop    chan struct{}
}

// StartFleet starts one Server per spec, listening on host at consecutive
// ports from firstPort (firstPort 0 lets the system pick free ports), its
// workers logging to log (nil discards). The fleet closes when ctx ends or
// Close is called. On error, nothing is left running.
func StartFleet(ctx context.Context, specs []WorkerSpec, host string, firstPort int, log *slog.Logger) (*Fleet, error) {
	if len(specs) == 0 {
		return nil, errors.New("sim: a fleet needs at least one worker")
	}
	if host == "" {
		host = "127.0.0.1"
	}
	f := &Fleet{stop: make(chan struct{})}
	for i, spec := range specs {
		name := spec.Name
		if name == "" {
			name = fmt.Sprintf("sim-%d", i)
		}
		port := 0
		if firstPort != 0 {
			port = firstPort + i
		}
		addr := net.JoinHostPort(host, strconv.Itoa(port))
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("sim: worker %s: listen on %s: %w", name, addr, err)
		}
		srv, err := NewServer(spec.Params, Options{TimeScale: spec.TimeScale, Name: name, Logger: log, KVEvents: spec.KVEvents, KVEventsReplay: spec.KVEventsReplay})
		if err != nil {
			ln.Close()
			f.Close()
			return nil, fmt.Errorf("sim: worker %s: %w", name, err)
		}
		hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second}
		w := &Worker{Name: name, URL: "http://" + ln.Addr().String(), Server: srv, http: hs}
		f.workers = append(f.workers, w)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := hs.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && log != nil {
				log.Error("sim worker stopped serving", "worker", name, "err", err)
			}
		}()
	}
	go func() {
		select {
		case <-ctx.Done():
			f.Close()
		case <-f.stop:
		}
	}()
	return f, nil
}

// URLs returns the workers' base URLs ("http://127.0.0.1:8081"), in spec
// order.
func (f *Fleet) URLs() []string {
	out := make([]string, len(f.workers))
	for i, w := range f.workers {
		out[i] = w.URL
	}
	return out
}

// Workers returns the running workers, in spec order.
func (f *Fleet) Workers() []*Worker { return append([]*Worker(nil), f.workers...) }

// Close stops every worker: listeners and connections first, then the
// engines. It is safe to call more than once.
func (f *Fleet) Close() {
	f.once.Do(func() {
		close(f.stop)
		for _, w := range f.workers {
			w.Server.Close() // ends streams in flight so Close below does not hang
			_ = w.http.Close()
		}
		f.wg.Wait()
	})
}

// DemoFleet returns four heterogeneous workers serving the same model: two
// reference cards, one slower card (Speed 0.6) and one with a quarter of
// the KV cache, so that a naive balancer's mistakes are visible.
func DemoFleet() []WorkerSpec {
	base := DefaultParams()
	mk := func(name string, seed int64, edit func(*Params)) WorkerSpec {
		p := base
		p.Seed = seed
		p.StartupDelay = 2 * time.Second
		if edit != nil {
			edit(&p)
		}
		return WorkerSpec{Name: name, Params: p}
	}
	return []WorkerSpec{
		mk("gpu-0", 1, nil),
		mk("gpu-1", 2, nil),
		mk("gpu-2-slow", 3, func(p *Params) { p.Speed = 0.6 }),
		mk("gpu-3-small-kv", 4, func(p *Params) { p.KVTokens = 8192 }),
	}
}

// fleetFile is the on-disk fleet description. Every worker field is
// optional and defaults to DefaultParams.
type fleetFile struct {
	TimeScale *float64     `yaml:"time_scale" json:"time_scale"`
	Workers   []fleetEntry `yaml:"workers" json:"workers"`
}

type fleetEntry struct {
	Name                string   `yaml:"name" json:"name"`
	Model               *string  `yaml:"model" json:"model"`
	Slots               *int     `yaml:"slots" json:"slots"`
	KVTokens            *int     `yaml:"kv_tokens" json:"kv_tokens"`
	PrefillTokensPerSec *float64 `yaml:"prefill_tokens_per_sec" json:"prefill_tokens_per_sec"`
	BatchTokens         *int     `yaml:"batch_tokens" json:"batch_tokens"`
	DecodeBase          *string  `yaml:"decode_base" json:"decode_base"`
	DecodePerSeq        *string  `yaml:"decode_per_seq" json:"decode_per_seq"`
	InterferenceScale   *float64 `yaml:"interference_scale" json:"interference_scale"`
	InterferenceSigma   *float64 `yaml:"interference_sigma" json:"interference_sigma"`
	Speed               *float64 `yaml:"speed" json:"speed"`
	StartupDelay        *string  `yaml:"startup_delay" json:"startup_delay"`
	Seed                *int64   `yaml:"seed" json:"seed"`
	OutputMedian        *float64 `yaml:"output_median" json:"output_median"`
	OutputSigma         *float64 `yaml:"output_sigma" json:"output_sigma"`
	OutputMin           *int     `yaml:"output_min" json:"output_min"`
	OutputMax           *int     `yaml:"output_max" json:"output_max"`
	TimeScale           *float64 `yaml:"time_scale" json:"time_scale"`
	KVEvents            string   `yaml:"kv_events" json:"kv_events"`
	KVEventsReplay      string   `yaml:"kv_events_replay" json:"kv_events_replay"`
	Slowdowns           []struct {
		After  string  `yaml:"after" json:"after"`
		For    string  `yaml:"for" json:"for"`
		Factor float64 `yaml:"factor" json:"factor"`
	} `yaml:"slowdowns" json:"slowdowns"`
}

// ParseFleetFile reads a fleet description: JSON if the file name ends in
// .json, YAML otherwise. Unknown keys are rejected; every problem is
// reported with its key path. Example:
//
//	time_scale: 1
//	workers:
//	  - name: gpu-0
//	  - name: gpu-1-slow
//	    speed: 0.6
//	  - name: gpu-2-small
//	    kv_tokens: 8192
//	    startup_delay: 30s
//	  - name: gpu-3-throttled
//	    slowdowns: [{after: 5m, for: 5m, factor: 0.5}]
//	  - name: gpu-4-events
//	    kv_events: 127.0.0.1:5557 # vLLM's KV-cache events (kvpublish.go)
//	    kv_events_replay: 127.0.0.1:5558
func ParseFleetFile(path string) ([]WorkerSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sim: read fleet file: %w", err)
	}
	specs, err := ParseFleet(data, strings.EqualFold(filepath.Ext(path), ".json"))
	if err != nil {
		return nil, fmt.Errorf("sim: fleet file %s: %w", path, err)
	}
	return specs, nil
}

// ParseFleet decodes a fleet description from data (JSON when isJSON,
// YAML otherwise); see ParseFleetFile.
func ParseFleet(data []byte, isJSON bool) ([]WorkerSpec, error) {
	var ff fleetFile
	if isJSON {
		dec := json.NewDecoder(bytes.NewReader(data))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&ff); err != nil {
			return nil, fmt.Errorf("decode JSON: %w", err)
		}
	} else {
		dec := yaml.NewDecoder(bytes.NewReader(data))
		dec.KnownFields(true)
		if err := dec.Decode(&ff); err != nil {
			return nil, fmt.Errorf("decode YAML: %w", err)
		}
	}
	if len(ff.Workers) == 0 {
		return nil, errors.New("workers: at least one worker is required")
	}
	var errs []error
	names := map[string]bool{}
	specs := make([]WorkerSpec, 0, len(ff.Workers))
	for i, w := range ff.Workers {
		key := fmt.Sprintf("workers[%d]", i)
		p := DefaultParams()
		p.Seed = int64(i + 1)
		dur := func(field string, src *string, dst *time.Duration) {
			if src == nil {
				return
			}
			d, err := time.ParseDuration(*src)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s.%s: %w", key, field, err))
				return
			}
			*dst = d
		}
		setIf(&p.Model, w.Model)
		setIf(&p.Slots, w.Slots)
		setIf(&p.KVTokens, w.KVTokens)
		setIf(&p.PrefillTokensPerSec, w.PrefillTokensPerSec)
		setIf(&p.BatchTokens, w.BatchTokens)
		dur("decode_base", w.DecodeBase, &p.DecodeBase)
		dur("decode_per_seq", w.DecodePerSeq, &p.DecodePerSeq)
		setIf(&p.InterferenceScale, w.InterferenceScale)
		setIf(&p.InterferenceSigma, w.InterferenceSigma)
		setIf(&p.Speed, w.Speed)
		dur("startup_delay", w.StartupDelay, &p.StartupDelay)
		setIf(&p.Seed, w.Seed)
		setIf(&p.OutputMedian, w.OutputMedian)
		setIf(&p.OutputSigma, w.OutputSigma)
		setIf(&p.OutputMin, w.OutputMin)
		setIf(&p.OutputMax, w.OutputMax)
		for j, sd := range w.Slowdowns {
			x := Slowdown{Factor: sd.Factor}
			dur(fmt.Sprintf("slowdowns[%d].after", j), &sd.After, &x.After)
			if sd.For != "" {
				dur(fmt.Sprintf("slowdowns[%d].for", j), &sd.For, &x.For)
			}
			p.Slowdowns = append(p.Slowdowns, x)
		}
		if err := p.Validate(); err != nil {
			errs = append(errs, prefixErrors(key, err))
		}
		name := w.Name
		if name == "" {
			name = fmt.Sprintf("sim-%d", i)
		}
		if names[name] {
			errs = append(errs, fmt.Errorf("%s.name: duplicate worker name %q", key, name))
		}
		names[name] = true
		scale := 1.0
		setIf(&scale, ff.TimeScale)
		setIf(&scale, w.TimeScale)
		if !(scale > 0) {
			errs = append(errs, fmt.Errorf("%s.time_scale: must be positive, got %v", key, scale))
		}
		for _, ep := range []struct{ field, addr string }{{"kv_events", w.KVEvents}, {"kv_events_replay", w.KVEventsReplay}} {
			if ep.addr == "" {
				continue
			}
			if _, port, err := net.SplitHostPort(ep.addr); err != nil || !isPort(port) {
				errs = append(errs, fmt.Errorf("%s.%s: %q: want host:port to listen on (port 0 picks one)", key, ep.field, ep.addr))
			}
		}
		if w.KVEventsReplay != "" && w.KVEvents == "" {
			errs = append(errs, fmt.Errorf("%s.kv_events_replay: set without kv_events", key))
		}
		specs = append(specs, WorkerSpec{Name: name, Params: p, TimeScale: scale, KVEvents: w.KVEvents, KVEventsReplay: w.KVEventsReplay})
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return specs, nil
}

// isPort reports whether s is a port number, 0..65535.
func isPort(s string) bool {
	n, err := strconv.Atoi(s)
	return err == nil && n >= 0 && n <= 65535
}

func setIf[T any](dst *T, src *T) {
	if src != nil {
		*dst = *src
	}
}

// prefixErrors puts key in front of each joined error of err.
func prefixErrors(key string, err error) error {
	var list interface{ Unwrap() []error }
	if errors.As(err, &list) {
		var out []error
		for _, e := range list.Unwrap() {
			out = append(out, fmt.Errorf("%s.%w", key, e))
		}
		return errors.Join(out...)
	}
	return fmt.Errorf("%s.%w", key, err)
}
