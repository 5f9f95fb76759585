package scheduler

// What the queue learns while requests wait: how fast each model's
// backlog drains (for deadlines and Retry-After) and how many tokens
// requests produce (for costs before they run).

import (
	"cmp"
	"fmt"
	"math/bits"
	"time"

	"github.com/sluice-router/sluice/internal/stats"
)

// drainRate measures how fast a model's backlog drains, in tokens per
// second of completed work. It is measured only while requests wait: when
// nobody waits, a release says how busy clients were, not how fast the
// workers are, and an idle hour must not read as a slow worker.
type drainRate struct {
	since  time.Time // start of the current window
	tokens float64   // completed since
	rate   stats.EMA // tokens/s
}

// timeFor is how long work (tokens) takes at the measured rate; false
// while the rate is unmeasured (d nil).
func (d *drainRate) timeFor(work float64) (time.Duration, bool) {
	if d == nil || !d.rate.Known() || d.rate.Value <= 0 {
		return 0, false
	}
	return time.Duration(work / d.rate.Value * float64(time.Second)), true
}

// minDrainWindow is the shortest window a drain-rate sample is taken over,
// so that two releases a moment apart do not read as an infinite rate.
const minDrainWindow = time.Second

// drained accounts tokens completed at now while the backlog that began at
// backlog waits. The first completion of a backlog starts the window
// rather than the backlog itself: the requests in flight when a backlog
// begins are, on average, the long ones, and counting from its start would
// read their remaining time as a slow drain.
func (d *drainRate) drained(tokens float64, backlog, now time.Time) {
	if d.since.Before(backlog) {
		d.since, d.tokens = now, 0 // a new backlog: a fresh window
		return
	}
	d.tokens += tokens
	if dt := now.Sub(d.since); dt >= minDrainWindow {
		d.rate = d.rate.Add(d.tokens/dt.Seconds(), 0.2)
		d.since, d.tokens = now, 0
	}
}

// estimator learns how many tokens requests produce, to estimate the
// output of a request before it runs: an EMA per model, per tenant of the
// model and per prompt-size bucket of the tenant (log2 of the prompt
// tokens). The estimate comes from the most specific level with enough
// samples — bucket, then tenant, then model — else the configured default;
// max_tokens caps it. Keys are served models (a lease exists only for one)
// and tenants, so the estimator does not grow with client input. It is
// guarded by the scheduler's lock.
type estimator struct {
	def    int
	models map[string]*modelEstimate
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
	// estimateMinSamples is how many samples a bucket or a tenant needs
	// before its average is trusted over the broader one.
	estimateMinSamples = 3
	// estimateAlpha is the smoothing factor of the output averages.
	estimateAlpha = 0.2
)

// Where an output estimate came from, as decision records say it.
const (
	EstimateBucket    = "bucket"     // the tenant's average for prompts of this size
	EstimateTenant    = "tenant"     // the tenant's average for the model
	EstimateModel     = "model"      // the model's average over every tenant
	EstimateDefault   = "default"    // Config.DefaultOutputTokens: nothing learned yet
	EstimateMaxTokens = "max_tokens" // the request's max_tokens, below the estimate
)

func promptBucket(prompt int) int {
	return min(bits.Len(uint(max(prompt, 0))), promptBuckets-1)
}

// estimate returns the expected output tokens of req and their source.
func (e *estimator) estimate(req *Request) (float64, string) {
	out, src := float64(e.def), EstimateDefault
	if m := e.models[req.Model]; m != nil {
		switch t := m.tenants[req.Tenant]; {
		case t != nil && t.buckets[promptBucket(req.PromptTokens)].N >= estimateMinSamples:
			out, src = t.buckets[promptBucket(req.PromptTokens)].Value, EstimateBucket
		case t != nil && t.all.N >= estimateMinSamples:
			out, src = t.all.Value, EstimateTenant
		case m.all.Known():
			out, src = m.all.Value, EstimateModel
		}
	}
	if req.MaxTokens > 0 && float64(req.MaxTokens) < out {
		out, src = float64(req.MaxTokens), EstimateMaxTokens
	}
	return out, src
}

// observe folds in that req produced tokens output tokens.
func (e *estimator) observe(req *Request, tokens int) {
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
	m.all = m.all.Add(x, estimateAlpha)
	t.all = t.all.Add(x, estimateAlpha)
	b := &t.buckets[promptBucket(req.PromptTokens)]
	*b = b.Add(x, estimateAlpha)
}

// classOf returns the index of the request's class in s.classes, the
// default class for an empty name.
func (s *Scheduler) classOf(name string) (int, bool) {
	if name == "" {
		return s.defClass, true
	}
	for i, c := range s.classes {
		if c.Name == name {
			return i, true
		}
	}
	return 0, false
}

// RequestedClass returns the class a request runs in when its API key
// grants the class granted (empty: the default) and the request asks for
// asked (the X-Sluice-Priority header; empty: no ask). A client may lower
// its priority, never raise it above its key's: an ask for a higher class
// gets the granted one. An unknown ask is returned as is, for admission to
// refuse with ErrUnknownClass.
func (s *Scheduler) RequestedClass(granted, asked string) string {
	if asked == "" {
		return granted
	}
	a, ok := s.classOf(asked)
	if !ok {
		return asked
	}
	if g, ok := s.classOf(granted); ok && s.classes[a].Priority < s.classes[g].Priority {
		return granted
	}
	return asked
}

// maxWait returns the queueing deadline of the named class.
func (s *Scheduler) maxWait(class string) time.Duration {
	if i, ok := s.classOf(class); ok && s.classes[i].MaxQueueWait > 0 {
		return s.classes[i].MaxQueueWait
	}
	return s.cfg.QueueTimeout
}

// weightOf returns a tenant's fair-share weight, 1 unless configured.
func (s *Scheduler) weightOf(tenant string) float64 {
	if w := s.cfg.TenantWeights[tenant]; w > 0 {
		return w
	}
	return 1
}

// checkClasses reports what makes a list of classes unusable.
func checkClasses(cs []Class) error {
	seen := map[string]bool{}
	for i, c := range cs {
		switch {
		case c.Name == "":
			return fmt.Errorf("scheduler: class %d has no name", i)
		case seen[c.Name]:
			return fmt.Errorf("scheduler: class %q listed twice", c.Name)
		case c.MaxQueueWait < 0:
			return fmt.Errorf("scheduler: class %q: negative max_queue_wait %v", c.Name, c.MaxQueueWait)
		}
		seen[c.Name] = true
	}
	return nil
}

// sortClasses returns the classes in priority order, stable for equal
// priorities, and the index of the default (first configured) class.
func sortClasses(cs []Class) ([]Class, int) {
	if len(cs) == 0 {
		cs = DefaultClasses()
	}
	def := cs[0].Name
	out := make([]Class, len(cs))
	copy(out, cs)
	// Insertion sort keeps equal priorities in configuration order.
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && cmp.Less(out[j].Priority, out[j-1].Priority); j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	for i, c := range out {
		if c.Name == def {
			return out, i
		}
	}
	return out, 0
}
