package stats

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
)

// boltBucket holds one JSON-encoded WorkerStats per worker name.
var boltBucket = []byte("worker_stats")

// BoltStore is a Store in a single bbolt file. bbolt commits each
// transaction with a copy-on-write B+tree and an fsync, so a crash mid-write
// leaves the previous committed state intact.
type BoltStore struct {
	db   *bolt.DB
	path string
}

// OpenBolt opens (or creates) the store at path. It fails fast, rather than
// hanging, when another process holds the file.
func OpenBolt(path string) (*BoltStore, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 2 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open stats store %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		_, err := tx.CreateBucketIfNotExists(boltBucket)
		return err
	})
	if err != nil {
		db.Close()
		return nil, fmt.Errorf("init stats store %s: %w", path, err)
	}
	return &BoltStore{db: db, path: path}, nil
}

// Load returns every stored entry.
func (s *BoltStore) Load(ctx context.Context) (map[string]WorkerStats, error) {
	out := map[string]WorkerStats{}
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(boltBucket).ForEach(func(k, v []byte) error {
			var ws WorkerStats
			if err := json.Unmarshal(v, &ws); err != nil {
				return fmt.Errorf("entry %q: %w", k, err)
			}
			out[string(k)] = ws
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("read stats store %s: %w", s.path, err)
	}
	return out, nil
}

// Save writes entries in one transaction: all or none.
func (s *BoltStore) Save(ctx context.Context, entries map[string]WorkerStats) error {
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
