// Package outlen learns how many tokens requests produce, to estimate a
// request's output before it runs: what the scheduler charges a request
// as its expected cost (prompt plus expected output) while it waits and
// runs. An Estimator is a plain value; its owner guards it.
package outlen

import (
	"math/bits"

	"github.com/sluice-router/sluice/internal/stats"
)

// Request is what an estimate is keyed by.
type Request struct {
	Model, Tenant string
	// PromptTokens is the prompt's size in tokens; MaxTokens the
	// request's output cap, 0 when unset.
	PromptTokens, MaxTokens int
}

// Estimator keeps an EMA of output tokens per model, per tenant of the
// model and per prompt-size bucket of the tenant (log2 of the prompt
// tokens). The estimate comes from the most specific level with enough
// samples — bucket, then tenant, then model — else Default; max_tokens
// caps it. Its keys are what the caller observes: a caller that observes
// only served models and known tenants does not grow it with client input.
type Estimator struct {
	// Default is the estimate before anything is learned.
	Default int
	models  map[string]*modelEstimate
}

type modelEstimate struct {
	all     stats.EMA
	tenants map[string]*tenantEstimate
}

type tenantEstimate struct {
	all     stats.EMA
	buckets [promptBuckets]stats.EMA
}

const (
	// promptBuckets bounds the prompt-size buckets: 0, 1, 2–3, 4–7, …;
	// the last takes every larger prompt.
	promptBuckets = 24
	// minSamples is how many samples a bucket or a tenant needs before
	// its average is trusted over the broader one.
	minSamples = 3
	// alpha is the smoothing factor of the output averages.
	alpha = 0.2
)

// Where an estimate came from, as decision records say it.
const (
	FromBucket    = "bucket"     // the tenant's average for prompts of this size
	FromTenant    = "tenant"     // the tenant's average for the model
	FromModel     = "model"      // the model's average over every tenant
	FromDefault   = "default"    // Estimator.Default: nothing learned yet
	FromMaxTokens = "max_tokens" // the request's max_tokens, below the estimate
)

func promptBucket(prompt int) int {
	return min(bits.Len(uint(max(prompt, 0))), promptBuckets-1)
}

// Estimate returns the expected output tokens of req and where they came
// from (one of the From constants).
func (e *Estimator) Estimate(req Request) (float64, string) {
	out, src := float64(e.Default), FromDefault
	if m := e.models[req.Model]; m != nil {
		switch t := m.tenants[req.Tenant]; {
		case t != nil && t.buckets[promptBucket(req.PromptTokens)].N >= minSamples:
			out, src = t.buckets[promptBucket(req.PromptTokens)].Value, FromBucket
		case t != nil && t.all.N >= minSamples:
			out, src = t.all.Value, FromTenant
		case m.all.Known():
			out, src = m.all.Value, FromModel
		}
	}
	if req.MaxTokens > 0 && float64(req.MaxTokens) < out {
		out, src = float64(req.MaxTokens), FromMaxTokens
	}
	return out, src
}

// Observe folds in that req produced tokens output tokens.
func (e *Estimator) Observe(req Request, tokens int) {
	if e.models == nil {
		e.models = map[string]*modelEstimate{}
	}
	m := e.models[req.Model]
	if m == nil {
		m = &modelEstimate{tenants: map[string]*tenantEstimate{}}
		e.models[req.Model] = m
	}
	t := m.tenants[req.Tenant]
	if t == nil {
		t = &tenantEstimate{}
		m.tenants[req.Tenant] = t
	}
	x := float64(tokens)
	m.all = m.all.Add(x, alpha)
	t.all = t.all.Add(x, alpha)
	b := &t.buckets[promptBucket(req.PromptTokens)]
	*b = b.Add(x, alpha)
}
