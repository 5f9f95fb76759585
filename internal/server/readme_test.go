package server

import (
	"log/slog"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// readmeRoutes reads the HTTP API table of docs/api.md (the README links it): each row's routes as
// "METHOD /path" (or "/path" alone when the row names no method), with the
// query strings left out. A path of one segment after a longer one is its
// sibling: "POST /api/workers/{name}/drain, /undrain".
func readmeRoutes(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(b)
	start := strings.Index(text, "## HTTP API")
	if start < 0 {
		t.Fatal("docs/api.md has no HTTP API section")
	}
	text = text[start:]
	if end := strings.Index(text[1:], "\n#"); end >= 0 {
		text = text[:end+1]
	}
	code := regexp.MustCompile("`([^`]+)`")
	var out []string
	for _, line := range strings.Split(text, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cell := strings.Split(strings.Trim(line, "|"), "|")[0]
		method, prev := "", ""
		for _, m := range code.FindAllStringSubmatch(cell, -1) {
			r := m[1]
			if f := strings.Fields(r); len(f) == 2 {
				method, r = f[0], f[1]
			}
			r, _, _ = strings.Cut(r, "?")
			r = strings.ReplaceAll(r, "…", "")
			if strings.Count(r, "/") == 1 && strings.Count(prev, "/") > 1 {
				r = prev[:strings.LastIndexByte(prev, '/')] + r
			}
			prev = r
			out = append(out, strings.TrimSpace(method+" "+r))
		}
	}
	return out
}

// TestReadme_RouteTableMatchesTheMux holds the README's HTTP API table to
// the routes the router registers: the same routes, the same methods. The
// inference routes take any method on the mux (the proxy answers 405 to
// anything but POST), and the README lists them as POST.
func TestReadme_RouteTableMatchesTheMux(t *testing.T) {
	cfg := testConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, nil)
	srv, err := New(cfg, Options{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	var served []string
	for _, p := range srv.patterns {
		switch {
		case p == "/":
			continue // the catch-all 404
		case p == "GET /{$}":
			p = "GET /"
		case slices.Contains(inferencePaths, p):
			p = "POST " + p
		}
		served = append(served, p)
	}
	documented := readmeRoutes(t)
	slices.Sort(served)
	slices.Sort(documented)
	if diff := cmp.Diff(served, documented); diff != "" {
		t.Errorf("README's routes (-served by the mux +in the README):\n%s", diff)
	}
	for _, doc := range []string{"../../README.md", "../../docs/api.md", "../../docs/configuration.md", "../../docs/routing.md", "../../docs/kubernetes.md", "../../docs/reliability.md"} {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, stale := range regexp.MustCompile("/admin/[a-z]+").FindAllString(string(b), -1) {
			t.Errorf("%s names %s: there is no /admin route (the admin API is /api/...)", doc, stale)
		}
	}
}
