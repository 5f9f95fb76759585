package decisions

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"sync"
)

// Log keeps the most recent records in a ring buffer and, optionally,
// appends every record to a JSONL file. A record is appended when it is
// decided; its request's first token comes later, so it is appended later
// as a line of its own with the record's id (see AddFirstToken). The file
// is rotated at MaxFileBytes.
type Log struct {
	mu   sync.Mutex
	ring []*Record
	next int            // index the next record goes to
	n    int            // records held, up to len(ring)
	byID map[string]int // ID -> ring index

	path string
	file *os.File
	w    *bufio.Writer
	werr error // first write error, reported by Close
	// size is what the file holds; at maxBytes it is rotated.
	size, maxBytes int64
}

// MaxFileBytes bounds the decision log's file. A line that would take it
// past the bound goes to a new file instead: the full one is renamed to
// its name plus ".1", replacing the one renamed before. So the log holds
// at most twice the bound on disk (a busy router writes some hundreds of
// bytes a decision, and the bound is then hours of decisions), the
// newest lines whole, in order, across the two files; a line of the new
// file that completes a record (a first token) may follow the record's
// own line in ".1".
const MaxFileBytes = 64 << 20

// NewLog returns a Log that keeps size records (size must be positive) and
// appends to the JSONL file at path when path is not empty.
func NewLog(size int, path string) (*Log, error) {
	if size <= 0 {
		return nil, fmt.Errorf("decisions: ring size %d must be positive", size)
	}
	l := &Log{ring: make([]*Record, size), byID: make(map[string]int, size), path: path, maxBytes: MaxFileBytes}
	if path != "" {
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
		if err != nil {
			return nil, fmt.Errorf("decisions: open %s: %w", path, err)
		}
		fi, err := f.Stat()
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("decisions: %w", err)
		}
		l.file, l.w, l.size = f, bufio.NewWriter(f), fi.Size()
	}
	return l, nil
}

// writeLine appends line to the file, rotating it first if line would
// take it past maxBytes. l.mu is held.
func (l *Log) writeLine(line []byte) {
	if l.werr != nil {
		return
	}
	n := int64(len(line)) + 1
	if l.size > 0 && l.size+n > l.maxBytes {
		if l.werr = l.rotate(); l.werr != nil {
			return
		}
	}
	l.w.Write(line)
	l.w.WriteByte('\n')
	// Flush per line: a decision log that loses its last seconds on a
	// crash loses exactly the decisions someone asks about.
	l.werr = l.w.Flush()
	l.size += n
}

// rotate renames the file to path.1 and goes on in a new one. The old
// file is renamed while still open, so it stays the one Close closes
// should the new one fail to open.
func (l *Log) rotate() error {
	if err := os.Rename(l.path, l.path+".1"); err != nil {
		return fmt.Errorf("rotate: %w", err)
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("rotate: %w", err)
	}
	old := l.file
	l.file, l.size = f, 0
	l.w.Reset(f)
	return old.Close()
}

// Add stores r. The record must not be changed afterwards.
func (l *Log) Add(r *Record) {
	var line []byte
	if l.w != nil {
		line, _ = json.Marshal(r) // a Record always marshals
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if old := l.ring[l.next]; old != nil {
		delete(l.byID, old.ID)
	}
	l.ring[l.next] = r
	l.byID[r.ID] = l.next
	l.next = (l.next + 1) % len(l.ring)
	if l.n < len(l.ring) {
		l.n++
	}
	if l.w != nil {
		l.writeLine(line)
	}
}

// AddFirstToken stores ft on r (Record.SetFirstToken) and appends it to
// the file as {"id": r.ID, "ttft_ms": …, "worker_ttft_ms": …}: the file is
// append-only, and r's own line was written when it was decided. A line
// without "time" is such an outcome of the decision above it with the same
// id; merging the two (jq: group_by(.id) | map(add)) gives the record as
// /debug/decisions shows it. Only the first call for r counts; r need not
// be held in the ring any more.
func (l *Log) AddFirstToken(r *Record, ft FirstToken) {
	if !r.SetFirstToken(ft) || l.w == nil {
		return
	}
	line, _ := json.Marshal(struct {
		ID string `json:"id"`
		FirstToken
	}{r.ID, ft}) // plain strings and numbers always marshal
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writeLine(line)
}

// AddContinuation stores c on r (Record.SetContinuation) and appends it
// to the file as {"id": r.ID, "continuation": {…}}, as AddFirstToken
// does its first token.
func (l *Log) AddContinuation(r *Record, c Continuation) {
	if !r.SetContinuation(c) || l.w == nil {
		return
	}
	line, _ := json.Marshal(struct {
		ID           string       `json:"id"`
		Continuation Continuation `json:"continuation"`
	}{r.ID, c})
	l.mu.Lock()
	defer l.mu.Unlock()
	l.writeLine(line)
}

// Get returns the record with id, if still held.
func (l *Log) Get(id string) (*Record, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	i, ok := l.byID[id]
	if !ok {
		return nil, false
	}
	return l.ring[i], true
}

// Recent returns up to limit records, newest first.
func (l *Log) Recent(limit int) []*Record {
	l.mu.Lock()
	defer l.mu.Unlock()
	if limit <= 0 || limit > l.n {
		limit = l.n
	}
	out := make([]*Record, 0, limit)
	for i := 1; i <= limit; i++ {
		out = append(out, l.ring[(l.next-i+len(l.ring))%len(l.ring)])
	}
	return out
}

// Close flushes and closes the JSONL file, reporting any write error.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.file == nil {
		return nil
	}
	err := l.werr
	if ferr := l.w.Flush(); err == nil {
		err = ferr
	}
	if cerr := l.file.Close(); err == nil {
		err = cerr
	}
	l.file = nil
	if err != nil {
		return fmt.Errorf("decisions: write log: %w", err)
	}
	return nil
}
