package server

import (
	"os/exec"
	"strings"
	"testing"
)

// TestServer_ServePathLinksNoPlotting keeps the benchmark's plotting
// stack (gonum/plot and its fonts, about 4.5 MB) out of the request path's
// imports: the router must not need what only `sluice bench` uses.
func TestServer_ServePathLinksNoPlotting(t *testing.T) {
	gocmd, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH to list imports with")
	}
	out, err := exec.Command(gocmd, "list", "-deps", ".", "../proxy", "../config").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if strings.HasPrefix(pkg, "gonum.org/") || strings.HasPrefix(pkg, "codeberg.org/go-fonts/") || strings.Contains(pkg, "/internal/bench") {
			t.Errorf("the serve path imports %s", pkg)
		}
	}
}
