package decisions

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestLog_RingKeepsNewest(t *testing.T) {
	l, err := NewLog(3, "")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		l.Add(&Record{ID: fmt.Sprint(i)})
	}
	var ids []string
	for _, r := range l.Recent(10) {
		ids = append(ids, r.ID)
	}
	if got, want := fmt.Sprint(ids), "[4 3 2]"; got != want {
		t.Fatalf("recent %s, want %s", got, want)
	}
	if _, ok := l.Get("1"); ok {
		t.Fatal("evicted record still found")
	}
	if r, ok := l.Get("3"); !ok || r.ID != "3" {
		t.Fatal("held record not found")
	}
	if got := len(l.Recent(2)); got != 2 {
		t.Fatalf("Recent(2) gave %d", got)
	}
}

func TestLog_AppendsJSONLWithBreakdown(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.jsonl")
	l, err := NewLog(2, path)
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{ID: "a", Candidates: []Candidate{{Worker: "w"}}}
	r.SetExplain(func(r *Record) { r.Candidates[0].Terms = []Term{{Name: "active_requests", Raw: 1}} })
	l.Add(r)
	l.Add(&Record{ID: "b"})
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	f, _ := os.Open(path)
	defer f.Close()
	sc := bufio.NewScanner(f)
	var got []*Record
	for sc.Scan() {
		rec := new(Record)
		if err := json.Unmarshal(sc.Bytes(), rec); err != nil {
			t.Fatal(err)
		}
		got = append(got, rec)
	}
	if len(got) != 2 || got[0].ID != "a" || len(got[0].Candidates[0].Terms) != 1 {
		t.Fatalf("file holds %+v; want both records, the first with its lazily built terms", got)
	}
}

func TestNewLog_RejectsBadSize(t *testing.T) {
	if _, err := NewLog(0, ""); err == nil {
		t.Fatal("size 0 accepted")
	}
}

func TestRecord_FirstTokenJoinsJSONOnce(t *testing.T) {
	r := &Record{ID: "a", Outcome: "bound", QueueWaitMs: 1200}
	keys := func() map[string]any {
		t.Helper()
		b, err := json.Marshal(r)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := keys(); m["ttft_ms"] != nil || m["worker_ttft_ms"] != nil {
		t.Fatalf("before its first token the record says ttft_ms=%v worker_ttft_ms=%v; want neither", m["ttft_ms"], m["worker_ttft_ms"])
	}
	if _, ok := r.FirstToken(); ok {
		t.Fatal("FirstToken reports one before it was set")
	}
	// Readers encode the record while the proxy files its first token.
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { json.Marshal(r) })
	}
	want := FirstToken{TTFTMs: 1450, WorkerTTFTMs: 250}
	if !r.SetFirstToken(want) {
		t.Fatal("the first SetFirstToken did not count")
	}
	wg.Wait()
	if r.SetFirstToken(FirstToken{TTFTMs: 1, WorkerTTFTMs: 1}) {
		t.Fatal("a second SetFirstToken counted")
	}
	m := keys()
	if diff := cmp.Diff(map[string]any{"queue_wait_ms": 1200.0, "ttft_ms": 1450.0, "worker_ttft_ms": 250.0},
		map[string]any{"queue_wait_ms": m["queue_wait_ms"], "ttft_ms": m["ttft_ms"], "worker_ttft_ms": m["worker_ttft_ms"]}); diff != "" {
		t.Errorf("JSON outcome fields (-want +got):\n%s", diff)
	}
	b, _ := json.Marshal(r)
	var back Record
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	got, ok := back.FirstToken()
	if !ok || back.ID != "a" || back.QueueWaitMs != 1200 {
		t.Fatalf("read back: id %q queue %v first token %v; want the record whole", back.ID, back.QueueWaitMs, ok)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("first token read back (-want +got):\n%s", diff)
	}
}

func TestLog_AppendsFirstTokenAsLaterLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.jsonl")
	l, err := NewLog(2, path)
	if err != nil {
		t.Fatal(err)
	}
	a, b := &Record{ID: "a", Outcome: "bound"}, &Record{ID: "b", Outcome: "bound"}
	l.Add(a)
	l.Add(b)
	l.AddFirstToken(a, FirstToken{TTFTMs: 900, WorkerTTFTMs: 300})
	l.AddFirstToken(a, FirstToken{TTFTMs: 5, WorkerTTFTMs: 5}) // only the first counts
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	if len(lines) != 3 {
		t.Fatalf("file has %d lines, want the two decisions and a's first token:\n%s", len(lines), raw)
	}
	if got, want := lines[2], `{"id":"a","ttft_ms":900,"worker_ttft_ms":300}`; got != want {
		t.Errorf("first-token line %s, want %s", got, want)
	}
	if got, _ := l.Get("a"); got != a {
		t.Fatal("record a not held")
	}
	if ft, ok := a.FirstToken(); !ok || ft.TTFTMs != 900 {
		t.Errorf("record a's first token %+v (set %v), want the one filed", ft, ok)
	}
}

// A record's continuation is stored once, shown in its JSON and read back
// from it.
func TestRecord_ContinuationRoundTrips(t *testing.T) {
	l, err := NewLog(4, "")
	if err != nil {
		t.Fatal(err)
	}
	r := &Record{ID: "d-1"}
	l.Add(r)
	c := Continuation{From: "gpu0", Reason: "drain", CarriedTokens: 40, GapMs: 83, Outcome: "ok"}
	l.AddContinuation(r, c)
	l.AddContinuation(r, Continuation{From: "other"})
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Record
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if got, ok := back.Continuation(); !ok || got != c {
		t.Fatalf("read back %+v (%v) from %s, want %+v", got, ok, b, c)
	}
}

// The file is rotated at its size bound: it becomes path.1 (replacing the
// one before) and a new file begins, so the log holds at most about twice
// the bound on disk, the newest lines whole and in order across the two
// files; a log reopened counts what its file already holds.
func TestLog_RotatesItsFileAtTheBoundKeepingOneOld(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.jsonl")
	open := func() *Log {
		l, err := NewLog(4, path)
		if err != nil {
			t.Fatal(err)
		}
		l.maxBytes = 1000 // four records of about 205 bytes
		return l
	}
	l := open()
	const n = 40
	for i := range n / 2 {
		l.Add(&Record{ID: fmt.Sprintf("r%02d", i), Outcome: "bound"})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	l = open()
	for i := n / 2; i < n; i++ {
		l.Add(&Record{ID: fmt.Sprintf("r%02d", i), Outcome: "bound"})
	}
	if err := l.Close(); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, p := range []string{path + ".1", path} {
		raw, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		if len(raw) > 1000 {
			t.Errorf("%s holds %d bytes, over the bound of 1000", filepath.Base(p), len(raw))
		}
		for line := range strings.Lines(string(raw)) {
			var rec Record
			if err := json.Unmarshal([]byte(line), &rec); err != nil {
				t.Fatalf("%s: line %q: %v", filepath.Base(p), line, err)
			}
			ids = append(ids, rec.ID)
		}
	}
	if len(ids) == 0 || ids[len(ids)-1] != fmt.Sprintf("r%02d", n-1) || len(ids) >= n {
		t.Fatalf("the two files hold %v; want the newest records up to r%02d, the oldest rotated away", ids, n-1)
	}
	first := 0
	fmt.Sscanf(ids[0], "r%d", &first)
	for i, id := range ids {
		if want := fmt.Sprintf("r%02d", first+i); id != want {
			t.Fatalf("the two files hold %v; want consecutive records, oldest first", ids)
		}
	}
}
