package compare

import (
	"bytes"
	"testing"

	"github.com/sluice-router/sluice/internal/bench"
	"github.com/sluice-router/sluice/internal/vsim"
)

// The herding line gives each row's share of scrapes that herded, in the
// rows' order, and is left out where a row has no balance (real HTTP).
func TestWriteBalance(t *testing.T) {
	runs := []bench.NamedRun{{Name: "sluice"}, {Name: "consistent-hash"}}
	var md bytes.Buffer
	writeBalance(&md, runs, map[string]*vsim.Balance{
		"sluice":          {Scrapes: 200, Herded: 3},
		"consistent-hash": {Scrapes: 100, Herded: 40},
	})
	want := "Herding, scrapes with a worker over 1.5× the mean load while another idled: sluice 1.5% (3 of 200), consistent-hash 40.0% (40 of 100).\n\n"
	if got := md.String(); got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}

	md.Reset()
	writeBalance(&md, runs, map[string]*vsim.Balance{"sluice": {Scrapes: 200, Herded: 3}})
	if md.Len() != 0 {
		t.Errorf("a row without a balance (over HTTP) must leave the line out, got %q", md.String())
	}
}
