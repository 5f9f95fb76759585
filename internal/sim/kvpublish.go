package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"github.com/sluice-router/sluice/internal/kvevents"
	"github.com/sluice-router/sluice/internal/prefix"
)

// kvPublisher sends a Server's cache events over ZeroMQ, as vLLM's
// ZmqEventPublisher does (Options.KVEvents). The engine's reports are
// queued under the server's mutex, in order, and one goroutine publishes
// them, so no network write happens under the lock and none is lost
// before it has its seq (the PUB socket may still drop it, as vLLM's
// does; the replay socket then has it).
type kvPublisher struct {
	pub    *kvevents.Publisher
	cancel context.CancelFunc
	wake   chan struct{}
	done   chan struct{}
	queue  []kvBatch // guarded by Server.mu
}

type kvBatch struct {
	at     time.Time
	events []kvevents.Event
}

// startKVEvents listens on opts.KVEvents and opts.KVEventsReplay and
// feeds the engine's cache events to them.
func (s *Server) startKVEvents() error {
	if s.opts.KVEvents == "" {
		return nil
	}
	replay := s.opts.KVEventsReplay
	if replay == "" {
		replay = "127.0.0.1:0"
	}
	ctx, cancel := context.WithCancel(context.Background())
	pub, err := kvevents.NewPublisher(ctx, s.opts.KVEvents, replay)
	if err != nil {
		cancel()
		return fmt.Errorf("sim: KV events: %w", err)
	}
	kp := &kvPublisher{pub: pub, cancel: cancel, wake: make(chan struct{}, 1), done: make(chan struct{})}
	s.kv = kp
	s.eng.OnCacheEvents(func(at time.Time, evs []kvevents.Event) {
		kp.queue = append(kp.queue, kvBatch{at, evs}) // the engine's caller holds s.mu
		select {
		case kp.wake <- struct{}{}:
		default:
		}
	})
	go s.publishKV(kp)
	return nil
}

// publishKV publishes queued batches until the server closes.
func (s *Server) publishKV(kp *kvPublisher) {
	defer close(kp.done)
	for {
		select {
		case <-kp.wake:
		case <-s.done:
			return
		}
		s.mu.Lock()
		q := kp.queue
		kp.queue = nil
		s.mu.Unlock()
		for _, b := range q {
			if _, err := kp.pub.Publish(float64(b.at.UnixNano())/1e9, b.events); err != nil {
				s.log.Warn("KV events: publish", "err", err)
			}
		}
	}
}

// stopKVEvents stops the publisher; the driver is stopped already.
func (s *Server) stopKVEvents() {
	if s.kv == nil {
		return
	}
	<-s.kv.done
	s.kv.pub.Close()
	s.kv.cancel()
}

// KVEvents returns the worker's KV-event publisher, nil without
// Options.KVEvents: its Endpoints are what a router's workers[].kv_events
// and kv_events_replay name, and tests make it drop batches (DropNext).
func (s *Server) KVEvents() *kvevents.Publisher {
	if s.kv == nil {
		return nil
	}
	return s.kv.pub
}

// handleTokenize answers POST /tokenize as vLLM does ({"model", "prompt"}
// or {"model", "messages"} in, {"count", "max_model_len", "tokens"} out;
// llama.cpp's {"content"} is read as a prompt), with the simulator's
// stand-in token ids (kvevents.go): its prompt blocks' ids, then the
// tail's, as many in all as a generation request's prompt counts.
func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	var in struct {
		Messages json.RawMessage `json:"messages"`
		Prompt   json.RawMessage `json:"prompt"`
		Content  json.RawMessage `json:"content"`
	}
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<20)).Decode(&in); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid JSON body: "+err.Error())
		return
	}
	if len(in.Prompt) == 0 {
		in.Prompt = in.Content
	}
	var chars int
	var err error
	if len(in.Messages) > 0 {
		chars, err = messagesChars(in.Messages)
	} else {
		_, chars, _, err = promptSize(in.Prompt)
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", err.Error())
		return
	}
	blocks := prefix.FromFields(in.Messages, in.Prompt, prefix.BlockBytes)
	ids := PromptTokenIDs(blocks, prefix.BlockTokens, estimateTokens(chars))
	writeJSON(w, http.StatusOK, map[string]any{"count": len(ids), "max_model_len": s.p.KVTokens, "tokens": ids})
}

// handleResetPrefixCache is vLLM's POST /reset_prefix_cache: the prefix
// cache is emptied, and AllBlocksCleared published.
func (s *Server) handleResetPrefixCache(w http.ResponseWriter, _ *http.Request) {
	s.mu.Lock()
	s.eng.ResetPrefixCache(s.modelNow())
	s.mu.Unlock()
	w.WriteHeader(http.StatusOK)
}
