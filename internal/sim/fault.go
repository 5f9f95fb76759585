package sim

import (
	"bytes"
	"net/http"
	"time"
)

// streamFault is a failure the server plays on its next streams: each of
// the next n streams it answers is sent k tokens, then fails the way how
// says — as a worker that died, hung or reported an error mid-stream does.
type streamFault struct {
	how     faultKind
	k, n    int
	release <-chan struct{} // ends a stall
}

type faultKind int

const (
	faultAbort faultKind = iota // the connection cut
	faultStall                  // nothing more until release
	faultError                  // an OpenAI-style error event
)

// AbortStreams makes each of the next n streamed answers break after k
// tokens (k at least 1): the tokens are written and flushed, then the
// connection is cut without the stream's end, and the sequence freed.
// It is how tests kill a worker at token k of a stream.
func (s *Server) AbortStreams(k, n int) { s.setFault(streamFault{how: faultAbort, k: k, n: n}) }

// StallStreams makes each of the next n streamed answers go silent after
// k tokens: the tokens are written and flushed, then nothing more is
// sent, the connection held open, until release is closed, the client
// leaves or the server closes (then the sequence is freed). It is how
// tests hang a worker mid-stream, for the router's idle timeout.
func (s *Server) StallStreams(k, n int, release <-chan struct{}) {
	s.setFault(streamFault{how: faultStall, k: k, n: n, release: release})
}

// ErrorStreams makes each of the next n streamed answers report an error
// after k tokens: the tokens, then the event vLLM's OpenAI server sends
// when generation fails mid-stream,
//
//	data: {"error":{"message":"boom","type":"server_error","code":500}}
//
// and data: [DONE] as vLLM ends it, the sequence freed.
func (s *Server) ErrorStreams(k, n int) { s.setFault(streamFault{how: faultError, k: k, n: n}) }

// faultErrorEvent is what ErrorStreams sends in place of the rest.
const faultErrorEvent = `data: {"error":{"message":"boom","type":"server_error","param":null,"code":500}}` + "\n\n" + "data: [DONE]\n\n"

func (s *Server) setFault(f streamFault) {
	f.k, f.n = max(f.k, 0), max(f.n, 0)
	s.mu.Lock()
	s.fault = f
	s.mu.Unlock()
}

// takeFault returns the fault the stream starting now must play (k 0 for
// none), and uses up one of the fault's streams.
func (s *Server) takeFault() streamFault {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fault.n == 0 || s.fault.k == 0 {
		return streamFault{}
	}
	s.fault.n--
	return s.fault
}

// playFault sends buf (the stream up to token f.k) and fails the stream
// as f says; the caller returns after it.
func (s *Server) playFault(w http.ResponseWriter, r *http.Request, buf *bytes.Buffer, f streamFault, cancel func(string)) {
	rc := http.NewResponseController(w)
	switch f.how {
	case faultStall:
		w.Write(buf.Bytes())
		rc.Flush()
		select {
		case <-f.release:
		case <-r.Context().Done():
		case <-s.done:
		}
		cancel("stall fault")
	case faultError:
		buf.WriteString(faultErrorEvent)
		w.Write(buf.Bytes())
		rc.Flush()
		cancel("error fault")
	default:
		w.Write(buf.Bytes())
		rc.Flush()
		cancel("abort fault")
		panic(http.ErrAbortHandler) // net/http cuts the connection
	}
}

// answerAtEOS answers a request whose prefill already holds the whole
// answer: the model's next token is its end, so the answer has no tokens,
// only its end (finish reason stop, usage).
func (s *Server) answerAtEOS(w http.ResponseWriter, g genRequest) {
	s.mu.Lock()
	s.nextResp++
	id := s.nextResp
	s.mu.Unlock()
	out := responder{s: s, g: g, id: id, created: time.Now().Unix()}
	res := Result{PromptTokens: g.req.PromptTokens, FinishReason: FinishStop}
	if !g.stream {
		writeJSON(w, http.StatusOK, out.final(0, res))
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	var buf bytes.Buffer
	writeEvent(&buf, out.lastChunk(0, res))
	if g.kind != kindNative {
		buf.WriteString("data: [DONE]\n\n")
	}
	w.Write(buf.Bytes())
}
