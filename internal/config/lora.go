package config

import (
	"fmt"
	"net"
	"net/url"
	"slices"
	"time"

	"github.com/sluice-router/sluice/internal/lora"
)

// LoRA configures LoRA adapters (lora:): which adapters exist, over which
// base model, and whether Sluice may load one on a worker that does not
// hold it (docs/routing.md, LoRA adapters).
type LoRA struct {
	// Adapters are the adapters requests may name in "model".
	Adapters []LoRAAdapter `yaml:"adapters"`
	// LoadOnDemand lets Sluice load an adapter on a vLLM worker serving
	// its base model (POST /v1/load_lora_adapter) when no worker holding
	// it has room.
	LoadOnDemand bool `yaml:"load_on_demand"`
	// MaxReplicas bounds how many workers may hold an adapter loaded on
	// demand.
	MaxReplicas int `yaml:"max_replicas"`
	// LoadTimeout bounds one load.
	LoadTimeout time.Duration `yaml:"load_timeout"`
}

// LoRAAdapter is one adapter of lora.adapters.
type LoRAAdapter struct {
	// Name is what requests put in "model".
	Name string `yaml:"name"`
	// Path is where the worker loads it from (vLLM's lora_path); for
	// llama.cpp the --lora file, which names the adapter there.
	Path string `yaml:"path"`
	// Base is the model it applies to.
	Base string `yaml:"base"`
}

// Scheduler is the scheduler's AdapterConfig (without its Loader).
func (l LoRA) Scheduler() lora.Config {
	ac := lora.Config{LoadOnDemand: l.LoadOnDemand, MaxReplicas: l.MaxReplicas, LoadTimeout: l.LoadTimeout}
	for _, a := range l.Adapters {
		ac.Adapters = append(ac.Adapters, lora.Spec{Name: a.Name, Base: a.Base, Path: a.Path})
	}
	return ac
}

// PathNames maps each adapter's path to its name, for llama.cpp's
// /lora-adapters, which lists files.
func (l LoRA) PathNames() map[string]string {
	if len(l.Adapters) == 0 {
		return nil
	}
	m := make(map[string]string, len(l.Adapters))
	for _, a := range l.Adapters {
		if a.Path != "" {
			m[a.Path] = a.Name
		}
	}
	return m
}

// validate reports the problems of lora: against the workers' models.
func (l LoRA) validate(workers []Worker, bad report) {
	if l.MaxReplicas < 1 {
		bad("lora.max_replicas", "must be at least 1, got %d", l.MaxReplicas)
	}
	positive(bad, "lora.load_timeout", l.LoadTimeout)
	var models []string
	for _, w := range workers {
		for _, m := range w.Models {
			if !slices.Contains(models, m) {
				models = append(models, m)
			}
		}
	}
	seen := map[string]int{}
	for i, a := range l.Adapters {
		key := fmt.Sprintf("lora.adapters[%d]", i)
		if a.Name == "" {
			bad(key+".name", "missing")
		} else if j, dup := seen[a.Name]; dup {
			bad(key+".name", "duplicate adapter %q (also lora.adapters[%d])", a.Name, j)
		} else if slices.Contains(models, a.Name) {
			bad(key+".name", "%q is also a worker's model: a request naming it would be ambiguous", a.Name)
		}
		seen[a.Name] = i
		switch {
		case a.Base == "":
			bad(key+".base", "missing: the model the adapter applies to")
		case len(models) > 0 && !slices.Contains(models, a.Base):
			bad(key+".base", "%s", didYouMean(fmt.Sprintf("%q is not a model of any worker (%s)", a.Base, oneOf(models)), a.Base, models))
		}
		if a.Path == "" && l.LoadOnDemand {
			bad(key+".path", "missing: load_on_demand needs the path a worker loads the adapter from")
		}
	}
}

// checkZMQ checks a ZeroMQ endpoint Sluice connects to: tcp://host:port.
func checkZMQ(s string) error {
	u, err := url.Parse(s)
	if err != nil {
		return err
	}
	if u.Scheme != "tcp" {
		return fmt.Errorf("%q: scheme must be tcp (vLLM's --kv-events-config endpoint, e.g. tcp://10.0.0.5:5557)", s)
	}
	if _, port, err := net.SplitHostPort(u.Host); err != nil || port == "" || u.Hostname() == "*" {
		return fmt.Errorf("%q: want tcp://host:port of the worker", s)
	}
	return nil
}
