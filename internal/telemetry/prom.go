package telemetry

import (
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Value is one number read from a payload, with the metric it came from.
// Present is false when the payload did not carry it; V is then 0 and
// must not be read as a fact.
type Value struct {
	// V is the value, already scaled to Sluice's units (fractions 0..1,
	// counts as counts).
	V float64 `json:"value"`
	// Present reports whether the payload carried the metric.
	Present bool `json:"present"`
	// Metric names the series the value came from, e.g.
	// "vllm:kv_cache_usage_perc"; set even when absent, to say what was
	// looked for.
	Metric string `json:"metric"`
}

// Metrics is what an inference server's /metrics says about its load.
type Metrics struct {
	// QueueLen is the number of requests waiting inside the server
	// (llama.cpp requests_deferred, vLLM num_requests_waiting).
	QueueLen Value `json:"queue_len"`
	// Running is the number of requests being processed.
	Running Value `json:"running"`
	// KVUsage is the fraction of the KV cache in use, 0..1.
	KVUsage Value `json:"kv_usage"`
	// KVUsedTokens is the number of KV cache cells in use (llama.cpp
	// kv_cache_tokens, older builds); with KVUsage it tells the cache's
	// whole size.
	KVUsedTokens Value `json:"kv_used_tokens,omitzero"`
	// PrefixCache is what the server says of its prefix cache (vLLM);
	// zero when it says nothing.
	PrefixCache PrefixCache `json:"prefix_cache,omitzero"`
}

// ErrMissing is matched (errors.Is) by every *MissingError.
var ErrMissing = errors.New("metrics missing")

// MissingError reports the metrics a payload did not carry. Parsers return
// it together with a usable partial result.
type MissingError struct {
	// Metrics lists what was looked for and not found, each with a short
	// reason when there is more to say than "absent".
	Metrics []string
}

// Error lists the missing metrics.
func (e *MissingError) Error() string {
	return "missing metrics: " + strings.Join(e.Metrics, ", ")
}

// Is makes errors.Is(err, ErrMissing) true.
func (e *MissingError) Is(target error) bool { return target == ErrMissing }

// missing collects absent metrics and turns them into an error or nil.
// A nil *missing records nothing: the metric is optional.
type missing []string

func (m *missing) add(format string, args ...any) {
	if m != nil {
		*m = append(*m, fmt.Sprintf(format, args...))
	}
}

// forModel says, of each absent metric, which model it was looked for
// and which models the payload serves.
func (m missing) forModel(label, model string, served []string) {
	for i := range m {
		m[i] += fmt.Sprintf(" for %s=%q (served: %s)", label, model, strings.Join(served, ", "))
	}
}

func (m missing) err() error {
	if len(m) == 0 {
		return nil
	}
	return &MissingError{Metrics: m}
}

// ErrMalformed is matched (errors.Is) by every error about input that
// could not be parsed at all.
var ErrMalformed = errors.New("malformed payload")

// malformedError is a parse failure for which errors.Is(err, ErrMalformed)
// holds and the cause (e.g. expfmt.ParseError with its line) stays
// reachable through errors.As.
type malformedError struct {
	what string
	err  error
}

func (e *malformedError) Error() string { return "malformed " + e.what + ": " + e.err.Error() }
func (e *malformedError) Unwrap() []error {
	return []error{ErrMalformed, e.err}
}

func malformed(what string, err error) error { return &malformedError{what: what, err: err} }

// families parses Prometheus text exposition format.
func families(r io.Reader) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, malformed("prometheus text", err)
	}
	return mfs, nil
}

// parseProm parses Prometheus text and reads it with read, which notes in
// miss what is absent; its errors name the exporter.
func parseProm[T any](r io.Reader, exporter string, read func(mfs familyMap, miss *missing) (T, error)) (T, error) {
	var v T
	mfs, err := families(r)
	if err == nil {
		var miss missing
		if v, err = read(mfs, &miss); err == nil {
			err = miss.err()
		}
	}
	if err != nil {
		return v, fmt.Errorf("parse %s metrics: %w", exporter, err)
	}
	return v, nil
}

// sample is one series of a family: its labels and its value.
type sample struct {
	labels map[string]string
	value  float64
}

// samples returns the series of the named family; ok is false when the
// family is absent or has no series. Gauges, counters and untyped series
// are read; other types have no single value and are skipped.
func samples(mfs map[string]*dto.MetricFamily, name string) ([]sample, bool) {
	mf := mfs[name]
	if mf == nil {
		return nil, false
	}
	var out []sample
	for _, m := range mf.GetMetric() {
		var v float64
		switch {
		case m.Gauge != nil:
			v = m.GetGauge().GetValue()
		case m.Counter != nil:
			v = m.GetCounter().GetValue()
		case m.Untyped != nil:
			v = m.GetUntyped().GetValue()
		default:
			continue
		}
		labels := make(map[string]string, len(m.GetLabel()))
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		out = append(out, sample{labels: labels, value: v})
	}
	return out, len(out) > 0
}

// finite reports whether v is usable as a reading.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// clamp01 bounds a fraction to 0..1; exporters overshoot by rounding.
func clamp01(v float64) float64 { return min(max(v, 0), 1) }

// labelValues returns the sorted distinct values of label across series.
func labelValues(ss []sample, label string) []string {
	var vals []string
	for _, s := range ss {
		if v, ok := s.labels[label]; ok {
			vals = append(vals, v)
		}
	}
	slices.Sort(vals)
	return slices.Compact(vals)
}

// familyMap is what expfmt's parser returns: families by name.
type familyMap = map[string]*dto.MetricFamily
