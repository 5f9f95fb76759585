package stats

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	bolt "go.etcd.io/bbolt"
)

func sample(n int64) WorkerStats {
	return WorkerStats{TTFTMs: EMA{Value: float64(n), N: n}, Updated: time.Unix(n, 0).UTC()}
}

// filled is a closed store at a new path holding entries.
func filled(t *testing.T, entries map[string]WorkerStats) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "stats.db")
	s, err := OpenBolt(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Save(context.Background(), entries); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

func logTo(buf *bytes.Buffer) *slog.Logger { return slog.New(slog.NewTextHandler(buf, nil)) }

func TestOpenBolt_CorruptFileIsMovedAsideAndStartsEmpty(t *testing.T) {
	for _, tc := range []struct {
		name     string
		corrupt  func(t *testing.T, path string)
		mustMove bool // false: the damage may miss every page in use
	}{
		{"not a bbolt file", func(t *testing.T, path string) {
			os.WriteFile(path, bytes.Repeat([]byte("garbage!"), 4096), 0o600)
		}, true},
		{"meta pages overwritten", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			for i := 16; i < 2*4096 && i < len(b); i++ {
				b[i] ^= 0x5a
			}
			os.WriteFile(path, b, 0o600)
		}, true},
		{"data pages overwritten", func(t *testing.T, path string) {
			b, _ := os.ReadFile(path)
			for i := 2 * 4096; i < len(b); i++ {
				b[i] = 0xff
			}
			os.WriteFile(path, b, 0o600)
		}, true},
		{"truncated to one page", func(t *testing.T, path string) {
			os.Truncate(path, 4096+100)
		}, true},
		{"truncated to half", func(t *testing.T, path string) {
			fi, _ := os.Stat(path)
			os.Truncate(path, fi.Size()/2)
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := map[string]WorkerStats{"w1": sample(3), "w2": sample(4)}
			path := filled(t, want)
			tc.corrupt(t, path)
			bad, _ := os.ReadFile(path)
			var logs bytes.Buffer
			s, err := OpenBolt(path, logTo(&logs))
			if err != nil {
				t.Fatalf("OpenBolt on a damaged file: %v, want a usable store", err)
			}
			defer s.Close()
			got, err := s.Load(context.Background(), []string{"w1", "w2"})
			if err != nil {
				t.Fatalf("Load: %v", err)
			}
			aside, _ := filepath.Glob(path + ".corrupt-*")
			if len(aside) == 0 && !tc.mustMove {
				// The damage missed every page in use: what loads must
				// then be exactly what was saved.
				if diff := cmp.Diff(want, got); diff != "" {
					t.Fatalf("a damaged file was trusted and loaded wrong data (-want +got):\n%s", diff)
				}
				return
			}
			if len(got) != 0 {
				t.Fatalf("fresh store holds %v, want nothing", got)
			}
			if !strings.Contains(logs.String(), "STATS STORE CORRUPT") {
				t.Errorf("no loud log line; logs:\n%s", logs.String())
			}
			if len(aside) != 1 {
				t.Fatalf("moved-aside files %v, want one", aside)
			}
			kept, _ := os.ReadFile(aside[0])
			if !bytes.Equal(kept, bad) {
				t.Fatal("the moved-aside file differs from the corrupt original")
			}
			if err := s.Save(context.Background(), map[string]WorkerStats{"w3": sample(5)}); err != nil {
				t.Fatalf("the fresh store does not take writes: %v", err)
			}
		})
	}
}

func TestOpenBolt_GoodFileIsNeverMovedOrRewritten(t *testing.T) {
	want := map[string]WorkerStats{"w1": sample(3), "w2": sample(4)}
	path := filled(t, want)
	var logs bytes.Buffer
	s, err := OpenBolt(path, logTo(&logs))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Load(context.Background(), []string{"w1", "w2"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("loaded (-want +got):\n%s", diff)
	}
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 0 || logs.Len() != 0 {
		t.Fatalf("a good file was treated as corrupt: %v; logs %s", aside, logs.String())
	}
}

func TestOpenBolt_MissingFileIsCreatedMissingDirectoryIsAnError(t *testing.T) {
	path := filepath.Join(t.TempDir(), "new.db")
	s, err := OpenBolt(path, nil)
	if err != nil {
		t.Fatalf("a missing file: %v, want it created", err)
	}
	s.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(t.TempDir(), "no", "such", "dir", "stats.db")
	if _, err := OpenBolt(missing, nil); err == nil || !strings.Contains(err.Error(), "directory") {
		t.Fatalf("a missing directory: %v, want an error naming it", err)
	}
	if _, err := os.Stat(filepath.Dir(missing)); err == nil {
		t.Fatal("OpenBolt created the missing directory")
	}
}

func TestBoltStore_UndecodableEntryIsSkippedNotFatal(t *testing.T) {
	path := filled(t, map[string]WorkerStats{"good": sample(7)})
	db, err := bolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	db.Update(func(tx *bolt.Tx) error { return tx.Bucket(boltBucket).Put([]byte("bad"), []byte("{not json")) })
	db.Close()
	var logs bytes.Buffer
	s, err := OpenBolt(path, logTo(&logs))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Load(context.Background(), []string{"good", "bad"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]WorkerStats{"good": sample(7)}, got); diff != "" {
		t.Fatalf("loaded (-want +got):\n%s", diff)
	}
	if !strings.Contains(logs.String(), "worker=bad") {
		t.Errorf("the skipped entry is not logged by name:\n%s", logs.String())
	}
}

func TestOpenBolt_HeldByAnotherOpenerFailsFast(t *testing.T) {
	path := filled(t, map[string]WorkerStats{"w": sample(1)})
	first, err := OpenBolt(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	if _, err := OpenBolt(path, nil); err == nil || !strings.Contains(err.Error(), "holds it") {
		t.Fatalf("second opener: %v, want a clear error", err)
	}
}

// makeReadOnly makes path unwritable for this process, or skips: root
// ignores file modes, so as root the immutable attribute is used.
func makeReadOnly(t *testing.T, path string) {
	t.Helper()
	if os.Geteuid() != 0 {
		if err := os.Chmod(path, 0o400); err != nil {
			t.Fatal(err)
		}
		return
	}
	out, err := exec.Command("chattr", "+i", path).CombinedOutput()
	if err != nil {
		t.Skipf("running as root, where file modes do not stop writes, and chattr +i is unavailable (%v: %s): cannot make a read-only file", err, out)
	}
	t.Cleanup(func() { exec.Command("chattr", "-i", path).Run() })
}

func TestOpenBolt_ReadOnlyFileLoadsAndWritesNothing(t *testing.T) {
	want := map[string]WorkerStats{"w1": sample(3)}
	path := filled(t, want)
	before, _ := os.ReadFile(path)
	makeReadOnly(t, path)
	var logs bytes.Buffer
	s, err := OpenBolt(path, logTo(&logs))
	if err != nil {
		t.Fatalf("a read-only file: %v, want it loaded", err)
	}
	defer s.Close()
	if !s.readOnly || !strings.Contains(logs.String(), "read-only") {
		t.Fatalf("readOnly = %v; logs %s", s.readOnly, logs.String())
	}
	got, err := s.Load(context.Background(), []string{"w1", "w2"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("loaded (-want +got):\n%s", diff)
	}
	if err := s.Save(context.Background(), map[string]WorkerStats{"w2": sample(9)}); err != nil {
		t.Fatalf("Save on a read-only store: %v", err)
	}
	after, _ := os.ReadFile(path)
	if !bytes.Equal(before, after) {
		t.Fatal("a read-only store's file changed")
	}
}

// fullDiskEnv names the store the re-executed test binary fills up.
const fullDiskEnv = "SLUICE_TEST_FULL_DISK_STORE"

// TestBoltStore_FullDiskChild is not a test: it is the process
// TestBoltStore_FullDiskFailsTheSaveAndKeepsTheData starts, whose file
// size limit (RLIMIT_FSIZE) plays a full disk without touching the
// machine's disks.
func TestBoltStore_FullDiskChild(t *testing.T) {
	path := os.Getenv(fullDiskEnv)
	if path == "" {
		t.Skip("runs only as the child of TestBoltStore_FullDiskFailsTheSaveAndKeepsTheData")
	}
	fail := func(format string, args ...any) {
		fmt.Printf("CHILD FAILED: "+format+"\n", args...)
		os.Exit(1)
	}
	signal.Ignore(syscall.SIGXFSZ) // a write past the limit then fails with EFBIG
	ctx := context.Background()
	s, err := OpenBolt(path, nil)
	if err != nil {
		fail("open: %v", err)
	}
	if err := s.Save(ctx, map[string]WorkerStats{"kept": sample(1)}); err != nil {
		fail("first save: %v", err)
	}
	fi, _ := os.Stat(path)
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_FSIZE, &lim)
	full := lim
	full.Cur = uint64(fi.Size())
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &full); err != nil {
		fail("setrlimit: %v", err)
	}
	big := map[string]WorkerStats{}
	for i := range 2000 {
		big[fmt.Sprintf("worker-%04d-%s", i, strings.Repeat("x", 200))] = sample(int64(i))
	}
	err = s.Save(ctx, big)
	if err == nil {
		fail("a save past the disk's end succeeded")
	}
	fmt.Println("SAVE ERROR:", err)
	if err := syscall.Setrlimit(syscall.RLIMIT_FSIZE, &lim); err != nil {
		fail("restore rlimit: %v", err)
	}
	if err := s.Save(ctx, map[string]WorkerStats{"after": sample(2)}); err != nil {
		fail("save once space is back: %v", err)
	}
	got, err := s.Load(ctx, append(slices.Collect(maps.Keys(big)), "kept", "after"))
	if err != nil {
		fail("load: %v", err)
	}
	if len(got) != 2 || !cmp.Equal(got["kept"], sample(1)) || !cmp.Equal(got["after"], sample(2)) {
		fail("after the failed save the store holds %d entries, want kept and after", len(got))
	}
	s.Close()
	os.Exit(0)
}

func TestBoltStore_FullDiskFailsTheSaveAndKeepsTheData(t *testing.T) {
	if os.Getenv(fullDiskEnv) != "" {
		t.Skip("in the child")
	}
	path := filepath.Join(t.TempDir(), "stats.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestBoltStore_FullDiskChild$")
	cmd.Env = append(os.Environ(), fullDiskEnv+"="+path)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "SAVE ERROR: write stats store") || !strings.Contains(string(out), "file too large") {
		t.Fatalf("the failed save's error is not clear:\n%s", out)
	}
}
