package sim

import (
	"bytes"
	"net/http"
	"time"
)

// abortFault is a crash the server plays on its next streams: each of
// the next n streams it answers stops after k tokens and its connection
// is cut, as a worker's that died mid-stream is.
type abortFault struct{ k, n int }

// AbortStreams makes each of the next n streamed answers break after k
// tokens (k at least 1): the tokens are written and flushed, then the
// connection is cut without the stream's end, and the sequence freed.
// It is how tests kill a worker at token k of a stream.
func (s *Server) AbortStreams(k, n int) {
	s.mu.Lock()
	s.abort = abortFault{k: max(k, 0), n: max(n, 0)}
	s.mu.Unlock()
}

// takeAbort returns the token after which the stream starting now must
// break, 0 for none, and uses up one of the fault's streams.
func (s *Server) takeAbort() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.abort.n == 0 || s.abort.k == 0 {
		return 0
	}
	s.abort.n--
	return s.abort.k
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
