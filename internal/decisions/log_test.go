package decisions

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"testing"
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
