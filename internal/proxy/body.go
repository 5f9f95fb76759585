package proxy

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"
)

// readBody reads a request's body, up to MaxBodyBytes and, when
// BodyTimeout is set, within it from now: a client that trickles its body
// would otherwise hold a connection, a goroutine and up to MaxBodyBytes
// for as long as it likes. The deadline is the connection's read
// deadline, lifted once the body is in: a stream then runs for as long as
// it takes. A writer that cannot set one (a test's recorder) reads
// without.
func (h *Handler) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if h.opt.BodyTimeout <= 0 {
		return io.ReadAll(http.MaxBytesReader(w, r.Body, h.opt.MaxBodyBytes))
	}
	rc := http.NewResponseController(w)
	set := rc.SetReadDeadline(time.Now().Add(h.opt.BodyTimeout)) == nil
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.opt.MaxBodyBytes))
	if set && err == nil {
		// Lifted only for a body read whole: net/http reads what is left
		// of a body before it answers, and past the deadline it gives up
		// at once and closes the connection.
		rc.SetReadDeadline(time.Time{})
	}
	return body, err
}

// bodyError answers a body that could not be read: too large, too slow,
// or cut off.
func (h *Handler) bodyError(p *protocol, w http.ResponseWriter, err error) (int, string) {
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return p.writeError(w, http.StatusRequestEntityTooLarge, "body_too_large", "", fmt.Sprintf("request body exceeds %d bytes", tooBig.Limit))
	case errors.Is(err, os.ErrDeadlineExceeded):
		return p.writeError(w, http.StatusRequestTimeout, "body_timeout", "",
			fmt.Sprintf("request body not received within %v (server.read_header_timeout plus proxy.max_body_bytes at 1 Mbit/s)", h.opt.BodyTimeout))
	}
	return p.writeError(w, http.StatusBadRequest, "bad_body", "", "reading request body: "+err.Error())
}
