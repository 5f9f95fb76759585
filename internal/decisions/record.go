// Package decisions holds the explanation of every routing decision: which
// workers were considered, each score term raw, normalised and weighted,
// which won and why the others were not eligible. Records are kept in a
// bounded ring buffer for /debug/decisions and optionally appended to a
// JSONL file, so "why was my request slow?" has an answer after the fact.
//
// # Concurrency Model
//
// A Record is built by the scheduler and never modified after it is handed
// to a Log, except by its explanation and its outcomes: the first Explain
// (or MarshalJSON) fills in the breakdown, the Candidates themselves for
// the scheduler's records, once for every reader; SetFirstToken,
// SetContinuation and SetPrefixOutcome, called as the request it bound
// ends, each store their outcome once through an atomic pointer. Read
// Candidates after Explain; the other fields, Summary and the outcomes may
// be read at any time. Log is safe for concurrent use: one mutex guards
// the ring and the file writer.
package decisions

import (
	"encoding/json"
	"sync"
	"sync/atomic"
	"time"
)

// Record explains one routing decision.
type Record struct {
	// ID identifies the decision; responses carry it in X-Sluice-Decision.
	ID string `json:"id"`
	// Time is when the decision was made (the request was bound or refused).
	Time time.Time `json:"time"`
	// Model is the requested model.
	Model string `json:"model"`
	// Policy names the routing policy that decided ("sluice" or a baseline).
	Policy string `json:"policy"`
	// Attempt is 1 for the first placement, 2 and more for retries after a
	// worker failed before sending anything.
	Attempt int `json:"attempt"`
	// PromptTokens is the estimated prompt size.
	PromptTokens int `json:"prompt_tokens"`
	// PromptSource says how PromptTokens was counted: "estimate: text/4",
	// "estimate: text × tokens/char from worker usage (…)" or "worker
	// /tokenize".
	PromptSource string `json:"prompt_source,omitempty"`
	// MaxTokens is the request's max_tokens, 0 when unset.
	MaxTokens int `json:"max_tokens,omitempty"`
	// Class is the request's priority class.
	Class string `json:"class,omitempty"`
	// Tenant names who sent the request (a name, never a key); empty for
	// the anonymous tenant.
	Tenant string `json:"tenant,omitempty"`
	// Session says where the request's session key came from and a short
	// digest of it, e.g. "header x-session-id #3f2a9c1e"; never the key
	// itself, which may be a user's identifier. Empty: no session.
	Session string `json:"session,omitempty"`
	// ExpectedOutputTokens is the output length the scheduler expected
	// when it decided, and EstimateSource where that came from: "bucket"
	// (the tenant's average for prompts of this size), "tenant", "model",
	// "default" (nothing learned yet) or "max_tokens" (the request's cap,
	// below the estimate). The actual output is not added to the record,
	// which changes once logged only by its first token (SetFirstToken);
	// it is in the response's usage.
	ExpectedOutputTokens int    `json:"expected_output_tokens"`
	EstimateSource       string `json:"estimate_source,omitempty"`
	// QueueWaitMs is how long the request waited in Sluice's queue. Its
	// time to first token, with the worker's share, joins it in the JSON
	// once the request has one (see FirstToken).
	QueueWaitMs float64 `json:"queue_wait_ms"`
	// QueueDepth is how many requests for the model were waiting when this
	// one arrived (0 when placed at once).
	QueueDepth int `json:"queue_depth"`
	// Outcome is "bound" or the refusal reason (e.g. "queue_full").
	Outcome string `json:"outcome"`
	// Chosen is the worker the request was bound to; empty when refused.
	Chosen string `json:"chosen,omitempty"`
	// Reason says in words why Chosen won (or why nothing did).
	Reason string `json:"reason"`
	// Candidates lists every configured worker, eligible or not. A
	// record's maker may leave it to be built by the explanation (see
	// SetExplain): read it after Explain, or use Summary.
	Candidates []Candidate `json:"candidates"`
	// Summary is what the record says of its candidates without building
	// them, for readers on the hot path (a log line per decision). It is
	// set when the record is made, before it is logged, and Explain never
	// writes it, so it may be read while another goroutine explains.
	Summary Summary `json:"-"`
	// Replica names the router replica that decided, when several share
	// the fleet through shared state.
	Replica string `json:"replica,omitempty"`
	// SharedStateAgeMs is how long before the decision the shared state
	// last answered.
	SharedStateAgeMs float64 `json:"shared_state_age_ms,omitempty"`
	// Degraded marks a decision made on this replica's local view because
	// the shared state was unavailable.
	Degraded bool `json:"degraded,omitempty"`
	// Promise is what the request was promised and predicted to get on
	// the chosen worker, when a predictor made a prediction (see Promise).
	Promise *Promise `json:"promise,omitempty"`
	// Adapter is the LoRA adapter the request names, when it names one.
	Adapter *Adapter `json:"adapter,omitempty"`

	// explain fills in the candidates or their Terms. The score is
	// computed on the hot path from plain numbers; the breakdown is built
	// from the same inputs only when someone reads the record.
	once    sync.Once
	explain func(*Record)
	// firstToken is the bound request's time to first token, nil until it
	// has one; with continuation and prefix, the only fields written after
	// the record is logged.
	firstToken atomic.Pointer[FirstToken]
	// continuation is set on the record of a lease that continued a
	// stream another worker broke (SetContinuation).
	continuation atomic.Pointer[Continuation]
	// prefix is what the chosen worker said it found cached, set when the
	// request ends (SetPrefixOutcome).
	prefix atomic.Pointer[PrefixOutcome]
}

// PrefixOutcome sets the belief of how much of the prompt the chosen
// worker held in its prefix cache (the chosen candidate's prefix match and
// source) against what the worker said it found, once the request ended.
type PrefixOutcome struct {
	// ExpectedCachedTokens is the belief at the decision: the chosen
	// worker's prefix match times the prompt.
	ExpectedCachedTokens int `json:"expected_cached_tokens"`
	// CachedTokens is the worker's own count.
	CachedTokens int `json:"cached_tokens"`
}

// SetPrefixOutcome stores what the worker said it found cached; only the
// first call counts. Safe while others read r.
func (r *Record) SetPrefixOutcome(o PrefixOutcome) bool {
	return r.prefix.CompareAndSwap(nil, &o)
}

// PrefixOutcome returns what SetPrefixOutcome stored, if anything.
func (r *Record) PrefixOutcome() (PrefixOutcome, bool) {
	if o := r.prefix.Load(); o != nil {
		return *o, true
	}
	return PrefixOutcome{}, false
}

// Continuation says why a decision placed the rest of a stream another
// worker had begun: from which worker, why that one stopped, how much of
// the answer was carried over to this one, how long the client waited
// between the last token before the break and the first one after it,
// and how the continuation ended.
type Continuation struct {
	From          string  `json:"from"`
	Reason        string  `json:"reason"` // upstream_failed, error_event, stream_idle, drain
	CarriedTokens int     `json:"carried_tokens"`
	GapMs         float64 `json:"gap_ms,omitempty"` // 0 when it never sent a token
	Outcome       string  `json:"outcome"`          // ok, failed
}

// SetContinuation stores what the decision continued; only the first
// call counts. Safe while others read r.
func (r *Record) SetContinuation(c Continuation) bool {
	return r.continuation.CompareAndSwap(nil, &c)
}

// Continuation returns what SetContinuation stored, if anything.
func (r *Record) Continuation() (Continuation, bool) {
	if c := r.continuation.Load(); c != nil {
		return *c, true
	}
	return Continuation{}, false
}

// Adapter is what a decision record says of the request's LoRA adapter.
type Adapter struct {
	// Name and Base are the adapter and the model it applies to.
	Name string `json:"name"`
	Base string `json:"base,omitempty"`
	// State is how the chosen worker held it: "loaded", "loading on
	// demand" (this request's bind set off the load) or "loading on
	// demand (by an earlier request)"; empty when nobody was chosen.
	State string `json:"state,omitempty"`
	// Holders is how many workers held it (or were loading it) at the
	// decision; MaxReplicas the most that may.
	Holders     int `json:"holders"`
	MaxReplicas int `json:"max_replicas,omitempty"`
}

// Promise is a request's SLO as admission by promise judged it, and what
// the chosen worker was predicted to give it. The outcome is recorded
// against it: FirstToken's WorkerTTFTMs and DecodeTPS are the actual
// values of PredictedTTFTMs and PredictedDecode.
type Promise struct {
	// ObjectiveMs is the request's TTFT objective, from its arrival;
	// RemainingMs what was left of it at the decision, after its wait.
	ObjectiveMs float64 `json:"ttft_objective_ms,omitempty"`
	RemainingMs float64 `json:"ttft_remaining_ms,omitempty"`
	// MinDecode is its decode floor, tokens/s; OnMiss what its SLO says
	// to do when it cannot be met ("serve" or "refuse").
	MinDecode float64 `json:"min_decode_tok_s,omitempty"`
	OnMiss    string  `json:"on_miss,omitempty"`
	// PredictedTTFTMs is the predicted time to first token on the chosen
	// worker, from sending it there; PredictedDecode the predicted decode
	// rate of its stream and PredictedOthersDecode that of the streams
	// already running there once it is added.
	PredictedTTFTMs       float64 `json:"predicted_ttft_ms"`
	PredictedDecode       float64 `json:"predicted_decode_tok_s"`
	PredictedOthersDecode float64 `json:"predicted_others_decode_tok_s,omitempty"`
	// ExpectedCachedTokens is how many of the prompt's tokens the
	// prediction took as cached on the chosen worker: the prefix term's
	// match there (the exact index of the worker's KV events, or the
	// guess) times the prompt. The engine's own count, when it reports
	// one, is in the response's usage.
	ExpectedCachedTokens int `json:"expected_cached_tokens,omitempty"`
	// Source says what the prediction rests on; Known whether it had
	// enough history to be used; Untrusted, when set, why the worker's
	// predictions are not used (they kept missing): it was judged by its
	// learned limit instead.
	Source    string `json:"prediction_source,omitempty"`
	Known     bool   `json:"prediction_known"`
	Untrusted string `json:"prediction_untrusted,omitempty"`
	// Verdict is what admission made of the predictions: "meets", or
	// why the request waited, was served anyway or was refused. Empty
	// when admission was by the learned limits and the prediction only
	// recorded.
	Verdict string `json:"verdict,omitempty"`
}

// FirstToken is what became of a bound request by its first token: the
// time to first token the client saw, and the worker's share of it. A
// record gains it after it is logged, when the request has ended having
// streamed at least one token; refusals, attempts that failed before
// answering and answers that were not streamed have none. Its fields join
// the record's own in JSON, beside queue_wait_ms.
type FirstToken struct {
	// TTFTMs is time to first token as the client saw it: from the
	// request's arrival at Sluice to its first token relayed to the
	// client, so parsing, the wait in Sluice's queue and any attempt that
	// failed before answering are included.
	TTFTMs float64 `json:"ttft_ms"`
	// WorkerTTFTMs is the worker's share: from sending the request to the
	// chosen worker to the worker's first token. It is what the moving
	// averages that score workers learn from.
	WorkerTTFTMs float64 `json:"worker_ttft_ms"`
	// DecodeTPS is the stream's decode rate after its first token, when
	// it produced more than one token.
	DecodeTPS float64 `json:"decode_tok_s,omitempty"`
}

// SetFirstToken stores the bound request's first token. A decision binds
// one attempt, which has at most one first token: only the first call
// counts, and it reports whether it did. Safe while others read r.
func (r *Record) SetFirstToken(ft FirstToken) bool {
	return r.firstToken.CompareAndSwap(nil, &ft)
}

// FirstToken returns what SetFirstToken stored, and whether it was called.
func (r *Record) FirstToken() (FirstToken, bool) {
	if ft := r.firstToken.Load(); ft != nil {
		return *ft, true
	}
	return FirstToken{}, false
}

// SetExplain registers fn to fill in the breakdown the first time the
// record is read (Explain or JSON): the candidates' Terms, or the
// Candidates themselves, and whatever else is cheaper to put in words
// later than at decision time. fn must compute from values captured at
// decision time, never from live state.
func (r *Record) SetExplain(fn func(*Record)) { r.explain = fn }

// AddExplain registers fn to run after the explanation already set, with
// the same rules as SetExplain.
func (r *Record) AddExplain(fn func(*Record)) {
	prev := r.explain
	r.explain = func(x *Record) {
		if prev != nil {
			prev(x)
		}
		fn(x)
	}
}

// Explain fills in the breakdown if it is not there yet and returns r.
// It is safe to call concurrently and more than once.
func (r *Record) Explain() *Record {
	r.once.Do(func() {
		if r.explain != nil {
			r.explain(r)
			r.explain = nil
		}
	})
	return r
}

// plainRecord is a Record without its methods, so that encoding one does
// not recurse into MarshalJSON.
type plainRecord Record

// recordJSON is a Record's JSON: its fields with those set after it was
// logged. A nil FirstToken leaves its fields out, and decoding allocates
// one only when the JSON has them.
type recordJSON struct {
	*plainRecord
	*FirstToken
	Continuation  *Continuation  `json:"continuation,omitempty"`
	PrefixOutcome *PrefixOutcome `json:"prefix_outcome,omitempty"`
}

// MarshalJSON encodes the record with its full breakdown and, once the
// request has them, its outcomes.
func (r *Record) MarshalJSON() ([]byte, error) {
	r.Explain()
	return json.Marshal(recordJSON{(*plainRecord)(r), r.firstToken.Load(), r.continuation.Load(), r.prefix.Load()})
}

// UnmarshalJSON decodes what MarshalJSON wrote, outcomes included, so a
// record read back from /debug/decisions or the log is whole.
func (r *Record) UnmarshalJSON(b []byte) error {
	v := recordJSON{plainRecord: (*plainRecord)(r)}
	if err := json.Unmarshal(b, &v); err != nil {
		return err
	}
	if v.FirstToken != nil {
		r.firstToken.Store(v.FirstToken)
	}
	if v.Continuation != nil {
		r.continuation.Store(v.Continuation)
	}
	if v.PrefixOutcome != nil {
		r.prefix.Store(v.PrefixOutcome)
	}
	return nil
}

// Summary counts a record's candidates and gives the chosen one's score.
type Summary struct {
	// Candidates is the number of workers considered (len(Candidates)).
	Candidates int
	// Eligible is how many of them could take the request.
	Eligible int
	// Score is the chosen worker's Total; 0 when none was chosen or the
	// policy does not score.
	Score float64
}

// Candidate is one worker's part in a decision.
type Candidate struct {
	// Worker is the worker's name.
	Worker string `json:"worker"`
	// Eligible reports whether the worker could take the request.
	Eligible bool `json:"eligible"`
	// Why says why an ineligible worker was skipped.
	Why string `json:"why,omitempty"`
	// Active and Limit are Sluice's in-flight count and the worker's
	// concurrency limit at decision time (before the reservation). With
	// replicas sharing the fleet, an eligible worker's Active is the
	// count across them that the shared ledger scored; an ineligible
	// one's, this replica's own.
	Active int `json:"active"`
	Limit  int `json:"limit"`
	// LimitSource says where the limit came from ("learned", "config",
	// "slots", "default") and LimitReason why it was that number.
	LimitSource string `json:"limit_source,omitempty"`
	LimitReason string `json:"limit_reason,omitempty"`
	// Terms is the score breakdown; empty for ineligible workers and for
	// baseline policies that do not score.
	Terms []Term `json:"terms,omitempty"`
	// Total is the sum of the weighted terms; lowest wins.
	Total float64 `json:"total"`
	// Rank is the worker's place among eligible candidates (1 = chosen).
	Rank int `json:"rank,omitempty"`
}

// Term is one score term of one candidate.
type Term struct {
	// Name is the term, e.g. "active_requests".
	Name string `json:"name"`
	// Raw is the measured value (a count, milliseconds, tokens/s, 0..1).
	Raw float64 `json:"raw"`
	// Norm is the value the weight multiplies (normalised where the term
	// normalises, else equal to Raw).
	Norm float64 `json:"norm"`
	// Weight is the configured weight; negative for a reward.
	Weight float64 `json:"weight"`
	// Weighted is Weight*Norm, the term's contribution to the total.
	Weighted float64 `json:"weighted"`
	// Source says where Raw came from.
	Source string `json:"source,omitempty"`
	// AgeMs is how old Raw was at decision time; omitted for values Sluice
	// computes itself at that moment.
	AgeMs float64 `json:"age_ms,omitempty"`
	// Stale marks telemetry older than the staleness bound.
	Stale bool `json:"stale,omitempty"`
	// Neutral marks a value given because the worker has no history yet.
	Neutral bool `json:"neutral,omitempty"`
}
