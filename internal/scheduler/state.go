package scheduler

import (
	"slices"
	"time"

	"github.com/sluice-router/sluice/internal/decisions"
	"github.com/sluice-router/sluice/internal/limit"
	"github.com/sluice-router/sluice/internal/lora"
	"github.com/sluice-router/sluice/internal/predict"
	"github.com/sluice-router/sluice/internal/snapshot"
)

// WorkerState is what the scheduler holds of a worker, for APIs and
// dashboards.
type WorkerState struct {
	Name     string          `json:"name"`
	Models   []string        `json:"models"`
	Health   snapshot.Health `json:"health"`
	Reason   string          `json:"health_reason,omitempty"`
	Draining bool            `json:"draining"`
	Active   int             `json:"active"`
	// OtherReplicas is the other replicas' requests in flight on the
	// worker as the shared ledger last reported them (0 without one).
	OtherReplicas int `json:"active_other_replicas,omitempty"`
	// Limit is the concurrency limit in force for a new request of the
	// worker's first model; Learned is the controller's limit before any
	// borrowing, Cap the most it may be, LimitSource where it came from and
	// LimitReason why it is that number.
	Limit       int    `json:"limit"`
	Learned     int    `json:"learned_limit"`
	Cap         int    `json:"limit_cap"`
	LimitSource string `json:"limit_source"`
	LimitReason string `json:"limit_reason"`
	// LimitMoved says when the learned limit last changed, from what, and
	// why it moved; empty before it has been learned.
	LimitMoved *LimitMove `json:"limit_moved,omitempty"`
	Floor      float64    `json:"min_stream_tok_s,omitempty"`
	// JobCost is the estimated outstanding tokens in flight.
	JobCost float64 `json:"job_cost"`
	// Snapshot is the telemetry the scheduler last saw.
	Snapshot *snapshot.Snapshot `json:"telemetry"`
	// LastTerms is the worker's part in the latest decision that scored
	// it, and LastScoredAt when that was.
	LastTerms    *decisions.Candidate `json:"last_terms,omitempty"`
	LastScoredAt time.Time            `json:"last_scored_at,omitzero"`
	// Prediction is how the predictor's predictions for the worker have
	// held up, when there is a predictor.
	Prediction *PredictionState `json:"prediction,omitempty"`
	// Adapters are the LoRA adapters the worker holds or is loading.
	Adapters []lora.State `json:"adapters,omitempty"`
}

// PredictionState is how a worker's predictions have held up: the median
// relative errors of its recent TTFT and decode predictions, and whether
// admission by promise trusts them (when not, why).
type PredictionState struct {
	TTFTError   float64 `json:"ttft_error"`
	DecodeError float64 `json:"decode_error"`
	TTFTN       int     `json:"ttft_n"`
	DecodeN     int     `json:"decode_n"`
	Trusted     bool    `json:"trusted"`
	Untrusted   string  `json:"untrusted,omitempty"`
	// RunTTFT and RunDecode tally every recorded error since the
	// predictor was made.
	RunTTFT   predict.Tally `json:"-"`
	RunDecode predict.Tally `json:"-"`
}

// LimitMove is the latest change of a worker's learned limit.
type LimitMove struct {
	At   time.Time `json:"at"`
	From int       `json:"from"`
	To   int       `json:"to"`
	Why  string    `json:"why"`
}

// Workers returns the state of every worker in configuration order.
func (s *Scheduler) Workers() []WorkerState {
	type last struct {
		rec *decisions.Record
		idx int
	}
	now := s.clock.Now()
	var out []WorkerState
	var lasts []last
	var lims []limit.State
	var moves []limit.Move
	func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		var gs []WorkerGauges
		gs, lims = s.gaugesLocked(now)
		for i, w := range s.workers {
			g, snap := &gs[i], gs[i].Snapshot
			out = append(out, WorkerState{
				Name: g.Name, Models: g.Models, Health: g.Health, Reason: snap.HealthReason,
				Draining: g.Draining, Active: g.Active, OtherReplicas: g.OtherReplicas, JobCost: w.cost,
				Limit: g.Limit, Learned: g.Learned, Cap: g.Cap, LimitSource: lims[i].Source.String(), Floor: g.Floor,
				Snapshot: snap, Adapters: w.adapters.States(snap.Adapters),
			})
			lasts = append(lasts, last{w.last, w.lastIdx})
			if !s.limits.Fixed {
				w.moved.Note(&lims[i], now)
				moves = append(moves, w.moved)
			}
		}
	}()
	// Explaining builds the breakdown: do it outside the routing lock.
	p := s.cfg.Predictor
	for i := range out {
		out[i].LimitReason = lims[i].String()
		if i < len(moves) && moves[i].Known {
			m := moves[i]
			out[i].LimitMoved = &LimitMove{At: m.At, From: m.From, To: m.State.Learned, Why: m.State.String()}
		}
		if p != nil {
			var ps PredictionState
			ps.TTFTError, ps.DecodeError, ps.TTFTN, ps.DecodeN = p.MedianErrors(out[i].Name)
			ps.Trusted, ps.Untrusted = p.Trusted(out[i].Name)
			ps.RunTTFT, ps.RunDecode = p.RunErrors(out[i].Name)
			out[i].Prediction = &ps
		}
		if l := lasts[i]; l.rec != nil {
			c := l.rec.Explain().Candidates[l.idx]
			out[i].LastTerms, out[i].LastScoredAt = &c, l.rec.Time
		}
	}
	return out
}

// Models returns the union of models served by workers that are not
// draining, sorted.
func (s *Scheduler) Models() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, w := range s.workers {
		if w.draining {
			continue
		}
		for _, m := range w.models(w.snapshot()) {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Changed returns a channel that is closed at the next change of admission
// state, so live views and tests wait instead of polling.
func (s *Scheduler) Changed() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.changed.ch == nil {
		s.changed.ch = make(chan struct{})
	}
	return s.changed.ch
}

// changes is the channel of Changed, under the scheduler's lock: closed
// at the next state change, nil while nobody waits.
type changes struct{ ch chan struct{} }

// notify wakes whoever waits on Changed: the state has changed.
func (c *changes) notify() {
	if c.ch != nil {
		close(c.ch)
		c.ch = nil
	}
}
