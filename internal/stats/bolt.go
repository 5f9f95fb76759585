package stats

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	bolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"
)

// boltBucket holds one JSON-encoded WorkerStats per worker name.
var boltBucket = []byte("worker_stats")

// BoltStore is a Store in a single bbolt file. bbolt commits each
// transaction with a copy-on-write B+tree and an fsync, so a crash mid-write
// leaves the previous committed state intact, and a write that fails (a
// full disk) is rolled back.
type BoltStore struct {
	db       *bolt.DB
	path     string
	readOnly bool
	log      *slog.Logger
}

// errCorrupt marks a store file that cannot be trusted.
var errCorrupt = errors.New("corrupt")

// OpenBolt opens (or creates) the store at path, starting with what can
// be trusted and saying so in the log:
//
//   - a missing file is created; a missing directory is an error (it is
//     more likely a typo or an unmounted volume than a wish);
//   - a corrupt file (bad meta pages, a failed consistency check, a panic
//     while reading it) is moved aside to <path>.corrupt-<time>, never
//     deleted or overwritten, and Sluice starts with empty averages;
//   - a file Sluice may read but not write is loaded and kept as it is:
//     new averages live in memory only;
//   - a file another process holds is an error after 2 s, not a hang.
//
// Entries that do not decode are skipped one by one (Load logs them).
func OpenBolt(path string, log *slog.Logger) (s *BoltStore, err error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if dir := filepath.Dir(path); dir != "" {
		if fi, err := os.Stat(dir); err != nil {
			return nil, fmt.Errorf("stats store %s: directory: %w", path, err)
		} else if !fi.IsDir() {
			return nil, fmt.Errorf("stats store %s: %s is not a directory", path, dir)
		}
	}
	s, err = openBolt(path, false, log)
	switch {
	case err == nil:
		return s, nil
	case errors.Is(err, errCorrupt):
		aside := fmt.Sprintf("%s.corrupt-%s", path, time.Now().UTC().Format("20060102T150405.000Z"))
		if rerr := os.Rename(path, aside); rerr != nil {
			return nil, fmt.Errorf("stats store %s is corrupt (%v) and could not be moved aside: %w", path, err, rerr)
		}
		log.Error("STATS STORE CORRUPT: moved it aside and starting with empty averages; the old file is kept for inspection",
			"path", path, "moved_to", aside, "err", err)
		if s, err = openBolt(path, false, log); err != nil {
			return nil, fmt.Errorf("stats store %s: after moving the corrupt file aside: %w", path, err)
		}
		return s, nil
	case isReadOnly(err):
		werr := err
		if s, err = openBolt(path, true, log); err != nil {
			return nil, fmt.Errorf("stats store %s is not writable (%v) and cannot be read either: %w", path, werr, err)
		}
		log.Error("stats store is read-only: its averages are loaded, but new ones will not be saved", "path", path, "err", werr)
		return s, nil
	}
	return nil, err
}

func isReadOnly(err error) bool {
	return errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS) || errors.Is(err, syscall.EPERM)
}

func openBolt(path string, readOnly bool, log *slog.Logger) (*BoltStore, error) {
	var db *bolt.DB
	err := guarded("opening it", func() (err error) {
		db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second, ReadOnly: readOnly})
		return err
	})
	if err != nil {
		switch {
		case errors.Is(err, berrors.ErrTimeout):
			return nil, fmt.Errorf("open stats store %s: another process (another Sluice?) holds it: %w", path, err)
		case errors.Is(err, errCorrupt):
			return nil, fmt.Errorf("open stats store %s: %w", path, err)
		case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrChecksum),
			errors.Is(err, berrors.ErrVersionMismatch), errors.Is(err, berrors.ErrInvalidMapping),
			strings.Contains(err.Error(), "file size too small"): // bbolt has no sentinel for a truncated file
			return nil, fmt.Errorf("open stats store %s: %w: %w", path, errCorrupt, err)
		}
		return nil, fmt.Errorf("open stats store %s: %w", path, err)
	}
	if err := check(db); err != nil {
		db.Close()
		return nil, fmt.Errorf("check stats store %s: %w", path, err)
	}
	if !readOnly {
		err = db.Update(func(tx *bolt.Tx) error {
			_, err := tx.CreateBucketIfNotExists(boltBucket)
			return err
		})
		if err != nil {
			db.Close()
			return nil, fmt.Errorf("init stats store %s: %w", path, err)
		}
	}
	return &BoltStore{db: db, path: path, readOnly: readOnly, log: log}, nil
}

// guarded runs f, which reads the file, turning a panic into an error
// that marks the file corrupt: bbolt panics on some damaged pages, and
// reading a page past a truncated file's end faults. The file handle a
// panic while opening leaks is the price of starting at all; it happens
// once, at start.
func guarded(what string, f func() error) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s panicked: %v", errCorrupt, what, r)
		}
	}()
	return f()
}

// check walks every page of db (bbolt's consistency check); what it
// finds marks the file corrupt.
func check(db *bolt.DB) error {
	return guarded("reading it", func() error {
		return db.View(func(tx *bolt.Tx) error {
			var first error
			for e := range tx.Check() { // read to the end: Check's goroutine holds tx
				if first == nil {
					first = fmt.Errorf("%w: %w", errCorrupt, e)
				}
			}
			return first
		})
	})
}

// Load returns the stored entries of workers that decode; ones that do
// not are skipped, each logged by name, so one bad entry costs only
// itself.
func (s *BoltStore) Load(ctx context.Context, workers []string) (map[string]WorkerStats, error) {
	out := map[string]WorkerStats{}
	read := func(tx *bolt.Tx) error {
		b := tx.Bucket(boltBucket)
		if b == nil { // a read-only store written by nobody yet
			return nil
		}
		for _, name := range workers {
			v := b.Get([]byte(name))
			if v == nil {
				continue
			}
			var ws WorkerStats
			if err := json.Unmarshal(v, &ws); err != nil {
				s.log.Warn("stats store: skipping an entry that does not decode", "path", s.path, "worker", name, "err", err)
				continue
			}
			out[name] = ws
		}
		return nil
	}
	if err := guarded("reading it", func() error { return s.db.View(read) }); err != nil {
		return nil, fmt.Errorf("read stats store %s: %w", s.path, err)
	}
	return out, nil
}

// Save writes entries in one transaction: all or none. A store opened
// read-only writes nothing (OpenBolt said so once, loudly).
func (s *BoltStore) Save(ctx context.Context, entries map[string]WorkerStats) error {
	if s.readOnly {
		return nil
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(boltBucket)
		for name, ws := range entries {
			v, err := json.Marshal(ws)
			if err != nil {
				return err
			}
			if err := b.Put([]byte(name), v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("write stats store %s: %w", s.path, err)
	}
	return nil
}

// Close closes the file.
func (s *BoltStore) Close() error { return s.db.Close() }
