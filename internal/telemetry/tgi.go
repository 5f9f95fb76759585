package telemetry

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// Metric names Hugging Face text-generation-inference exposes on GET
// /metrics (docs/source/reference/metrics.md; router/src/server.rs). The
// series are unlabelled gauges. TGI has no KV-cache gauge:
// tgi_batch_current_max_tokens, the tokens the running batch has reserved,
// is read against the max_batch_total_tokens of /info instead.
const (
	TGIQueueSize              = "tgi_queue_size"
	TGIBatchCurrentSize       = "tgi_batch_current_size"
	TGIBatchCurrentMaxTokens  = "tgi_batch_current_max_tokens"
	tgiMaxBatchTotalTokensKey = "max_batch_total_tokens"
)

// ParseTGI reads TGI's /metrics. QueueLen is tgi_queue_size, Running is
// tgi_batch_current_size and KVUsage is tgi_batch_current_max_tokens
// divided by maxBatchTotalTokens (the token budget /info reports). With
// maxBatchTotalTokens 0 (unknown: newer /info answers leave it out) KVUsage
// is reported missing.
//
// Malformed text returns an error wrapping ErrMalformed. Absent metrics
// return the partial Metrics and a *MissingError.
func ParseTGI(r io.Reader, maxBatchTotalTokens int) (Metrics, error) {
	return parseProm(r, "tgi", func(mfs familyMap, miss *missing) (Metrics, error) {
		m := Metrics{
			QueueLen: aggregate(mfs, TGIQueueSize, nil, sum, miss),
			Running:  aggregate(mfs, TGIBatchCurrentSize, nil, sum, miss),
			KVUsage:  Value{Metric: TGIBatchCurrentMaxTokens},
		}
		if maxBatchTotalTokens > 0 {
			m.KVUsage = aggregate(mfs, TGIBatchCurrentMaxTokens, nil, func(vs []float64) float64 {
				return clamp01(sum(vs) / float64(maxBatchTotalTokens))
			}, miss)
		} else {
			miss.add("%s (no %s in /info to divide by)", TGIBatchCurrentMaxTokens, tgiMaxBatchTotalTokensKey)
		}
		return m, nil
	})
}

// TGIInfo is what TGI's GET /info says that Sluice uses.
type TGIInfo struct {
	// ModelID is the served model, e.g. "meta-llama/Llama-3.1-8B-Instruct".
	ModelID string `json:"model_id"`
	// MaxTotalTokens is the longest prompt plus completion a request may
	// have: the worker's context size for Sluice.
	MaxTotalTokens int `json:"max_total_tokens,omitempty"`
	// MaxBatchTotalTokens is the token budget of a batch; 0 when /info
	// leaves it out.
	MaxBatchTotalTokens int `json:"max_batch_total_tokens,omitempty"`
}

// ParseTGIInfo reads TGI's GET /info. A missing model_id returns the rest
// and a *MissingError.
func ParseTGIInfo(r io.Reader) (TGIInfo, error) {
	var info TGIInfo
	if err := decodeJSON(r, &info); err != nil {
		return TGIInfo{}, fmt.Errorf("parse tgi info: %w", err)
	}
	info.MaxTotalTokens = max(info.MaxTotalTokens, 0)
	info.MaxBatchTotalTokens = max(info.MaxBatchTotalTokens, 0)
	if info.ModelID == "" {
		return info, fmt.Errorf("parse tgi info: %w", &MissingError{Metrics: []string{"model_id"}})
	}
	return info, nil
}

// ParseTGIHealth reads TGI's GET /health: 200 (empty body) is ready;
// anything else is an error, with TGI's own words when the body carries
// them ({"error":"unhealthy","error_type":"healthcheck"} on 503). TGI only
// listens once its shards are up, so there is no loading answer.
func ParseTGIHealth(status int, body io.Reader) HealthResult {
	if status == http.StatusOK {
		return HealthResult{State: StateReady}
	}
	msg := fmt.Sprintf("HTTP %d", status)
	var b struct {
		Error     string `json:"error"`
		ErrorType string `json:"error_type"`
	}
	if raw, err := io.ReadAll(io.LimitReader(body, 64<<10)); err == nil && json.Unmarshal(raw, &b) == nil && b.Error != "" {
		msg += ": " + b.Error
		if b.ErrorType != "" {
			msg += " (" + b.ErrorType + ")"
		}
	}
	return HealthResult{State: StateError, Message: msg}
}
