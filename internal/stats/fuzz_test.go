package stats

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// FuzzOpenBolt opens arbitrary bytes as a store file: OpenBolt must not
// crash (bbolt panics or faults on some damage), and whatever it returns
// must load and take a write. Seeds are a good file and damaged copies of
// it, including the damaged freelist that made bbolt panic.
func FuzzOpenBolt(f *testing.F) {
	dir := f.TempDir()
	path := filepath.Join(dir, "seed.db")
	s, err := OpenBolt(path, nil)
	if err != nil {
		f.Fatal(err)
	}
	s.Save(context.Background(), map[string]WorkerStats{"w1": sample(3), "w2": sample(4)})
	s.Close()
	good, err := os.ReadFile(path)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add(good[:4096+100])
	f.Add(good[:len(good)/2])
	flipped := append([]byte(nil), good...)
	for i := 16; i < 2*4096; i++ {
		flipped[i] ^= 0x5a
	}
	f.Add(flipped)
	pages := append([]byte(nil), good...)
	for i := 2 * 4096; i < len(pages); i++ {
		pages[i] = 0xff
	}
	f.Add(pages)
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "stats.db")
		if err := os.WriteFile(path, data, 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := OpenBolt(path, nil)
		if err != nil {
			return // a clear error is an allowed outcome
		}
		defer s.Close()
		if _, err := s.Load(context.Background(), []string{"w1", "x"}); err != nil {
			t.Fatalf("opened but cannot load: %v", err)
		}
		if err := s.Save(context.Background(), map[string]WorkerStats{"x": sample(1)}); err != nil {
			t.Fatalf("opened but cannot save: %v", err)
		}
	})
}
