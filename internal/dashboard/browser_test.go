package dashboard_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/dashboard"
	"github.com/sluice-router/sluice/internal/proxy"
	"github.com/sluice-router/sluice/internal/scheduler"
)

// findBrowser returns a Chromium or Chrome binary: $SLUICE_CHROME, else the
// first of the usual names on $PATH. The test skips when there is none,
// except in CI (CI set, as .ci/run sets it), where it fails: .ci/run
// installs Chromium, so the browser test must never pass unrun there.
func findBrowser(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("SLUICE_CHROME"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if ci := os.Getenv("CI"); ci != "" && ci != "false" {
		t.Fatal("no Chromium or Chrome binary on $PATH, and CI is set: the browser test must run in CI (.ci/install-deps installs chromium)")
	}
	t.Skip("no Chromium or Chrome binary on $PATH (apt-get install -y chromium, or set SLUICE_CHROME): skipping the browser test")
	return ""
}

// newBrowser starts a headless browser with a fresh profile and returns a
// context whose actions run in its tab.
func newBrowser(t *testing.T, width, height int) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(findBrowser(t)),
		chromedp.Headless,
		chromedp.NoSandbox, // CI runs as root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.Flag("disable-background-timer-throttling", true),
		chromedp.Flag("disable-renderer-backgrounding", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithLogf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// The first Run starts the browser; it must not carry a timeout.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start %s: %v", findBrowser(t), err)
	}
	return ctx
}

// do runs actions in the page, bounded in time: a query for a node that
// never comes fails instead of hanging.
func do(ctx context.Context, actions ...chromedp.Action[chromedp.Void]) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return chromedp.Do(ctx, actions...)
}

// artifactDir is where the test leaves its screenshots: $SLUICE_ARTIFACTS
// when set, else a temporary directory.
func artifactDir(t *testing.T) string {
	if d := os.Getenv("SLUICE_ARTIFACTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// waitJS waits until the JavaScript expression is truthy in the page and
// returns its value; it fails the test with what after 30 s.
func waitJS[T any](t *testing.T, ctx context.Context, what, expr string) T {
	t.Helper()
	pctx, cancel := context.WithTimeout(ctx, 35*time.Second)
	defer cancel()
	v, err := chromedp.Run(pctx, chromedp.Poll[T](expr, chromedp.WithPollingInterval(50*time.Millisecond), chromedp.WithPollingTimeout(30*time.Second)))
	if err != nil {
		sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		state, _ := chromedp.Run(sctx, chromedp.Evaluate[string](`JSON.stringify({chips: document.querySelector(".chips")?.innerText, banner: document.getElementById("banner")?.innerText, cards: document.querySelectorAll("#cards .card").length, rows: document.querySelectorAll("#dlist tr[data-id]").length})`))
		t.Fatalf("waiting for %s (%s): %v; page: %s", what, expr, err, state)
	}
	return v
}

// screenshot resizes the viewport to width and the page's height (a
// full-page capture would draw the sticky header mid-page) and saves a PNG.
func screenshot(t *testing.T, ctx context.Context, width int64, path string) {
	t.Helper()
	if err := do(ctx, chromedp.EmulateViewport(width, 1000)); err != nil {
		t.Fatal(err)
	}
	h := waitJS[int64](t, ctx, "page height", `document.documentElement.scrollHeight`)
	if err := do(ctx, chromedp.EmulateViewport(width, h)); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "charts redrawn at the new width", fmt.Sprintf(`(() => { const s = document.getElementById("ch-queue"); return Math.abs(s.viewBox.baseVal.width - s.clientWidth) < 2; })()`))
	sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(sctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

func intText(t *testing.T, ctx context.Context, id string) int {
	t.Helper()
	ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := chromedp.Run(ectx, chromedp.Evaluate[string](fmt.Sprintf(`document.getElementById(%q).textContent`, id)))
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("#%s shows %q, want a number", id, s)
	}
	return n
}

// TestDashboard_LiveInBrowserUnderLoad opens the dashboard in headless
// Chromium in front of a simulated fleet under load and checks that it
// shows the fleet, charts and decisions with live values, that they follow
// the load as it starts and stops, that TTFT is drawn as clients see it
// with the workers' share beside it, and that a decision found by the id
// of a response's X-Sluice-Decision shows its breakdown and both TTFTs.
func TestDashboard_LiveInBrowserUnderLoad(t *testing.T) {
	const workers = 4
	ctx := newBrowser(t, 1400, 1000)
	r := startRouter(t, workers, 5, func(c *config.Config) {
		c.Admission.MaxQueue = 2 // small, so the load meets 429s too
	})

	if err := do(ctx, chromedp.Navigate(r.url+"/")); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "a card per worker", fmt.Sprintf(`document.querySelectorAll("#cards .card").length === %d`, workers))
	waitJS[bool](t, ctx, "live indicator", `document.getElementById("live-text").textContent === "live"`)
	waitJS[bool](t, ctx, "cards show health and limits", `[...document.querySelectorAll("#cards .card")].every(c => c.dataset.health === "ok" && /\/\d+/.test(c.querySelector(".num").textContent))`)

	// One streamed request of our own, to look up by its decision id later.
	resp, body, err := r.chat(context.Background(), http.DefaultClient, true, 8)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("first request: %v %v %s", err, resp, body)
	}
	ownID := resp.Header.Get("X-Sluice-Decision")
	if ownID == "" {
		t.Fatal("response has no X-Sluice-Decision")
	}

	// Find our own request's decision by its id.
	if err := do(ctx,
		chromedp.SendKeys("#search-id", ownID),
		chromedp.Click("#search button"),
	); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the searched decision", fmt.Sprintf(`document.querySelector("#detail h3")?.dataset.decision === %q && document.querySelector("#detail .cand.chosen") !== null`, ownID))
	waitJS[bool](t, ctx, "its TTFT as the client saw it, no less than the worker's share", `(() => {
		const ms = (k) => { const m = /([\d.]+) (ms|s)$/.exec(document.querySelector('#detail .facts [data-k="' + k + '"] b')?.textContent || ""); return m ? +m[1] * (m[2] === "s" ? 1000 : 1) : NaN; };
		return ms("ttft") > 0 && ms("worker-ttft") > 0 && ms("ttft") >= ms("worker-ttft") && ms("queue") >= 0;
	})()`)

	// Under load: more clients than the fleet has slots (4 x 4) plus queue
	// room.
	l := r.startLoad(t, 20, 5000)
	waitJS[bool](t, ctx, "requests in flight", `+document.getElementById("sum-active").textContent > 0 && [...document.querySelectorAll("#cards .card")].some(c => +c.dataset.active > 0)`)
	waitJS[bool](t, ctx, "a queue", `+document.getElementById("sum-queued").textContent > 0 || state.samples.some(s => s.queued > 0)`)
	admitted := intText(t, ctx, "sum-admitted")
	waitJS[bool](t, ctx, "admissions counted live", fmt.Sprintf(`+document.getElementById("sum-admitted").textContent > %d`, admitted))
	waitJS[bool](t, ctx, "429s counted", `+document.getElementById("sum-429").textContent > 0`)
	for _, ch := range []string{"queue", "admit", "refuse", "ttft", "tpot", "conc"} {
		waitJS[bool](t, ctx, "chart "+ch, fmt.Sprintf(`(() => { const s = document.getElementById("ch-%s"); return +s.dataset.points >= 2 && s.querySelectorAll("path").length > 0; })()`, ch))
	}
	waitJS[bool](t, ctx, "TTFT percentiles", `/\d/.test(document.querySelector("#lg-ttft b").textContent) && /\d/.test(document.querySelector("#lg-tpot b").textContent)`)
	waitJS[bool](t, ctx, "the workers' share beside the clients' TTFT", `/\d/.test(document.querySelector('#lg-ttft span[data-k="worker"] b').textContent) && document.querySelectorAll("#ch-ttft path[stroke-dasharray]").length > 0`)
	// Every request's TTFT from arrival is at least its worker's share, so
	// every percentile is too.
	waitJS[bool](t, ctx, "client percentiles no lower than the workers'", `state.samples.filter(s => s.ttft_ms).every(s => s.worker_ttft_ms && s.ttft_ms.p50 >= s.worker_ttft_ms.p50 && s.ttft_ms.p99 >= s.worker_ttft_ms.p99)`)
	waitJS[bool](t, ctx, "concurrency lines per worker", fmt.Sprintf(`document.querySelectorAll("#lg-conc span").length === %d`, workers))
	waitJS[bool](t, ctx, "score bars with terms", `[...document.querySelectorAll("#cards .card")].some(c => c.querySelectorAll(".sbar span[title]").length >= 2)`)
	waitJS[bool](t, ctx, "averages measured", `[...document.querySelectorAll("#cards .card .kv dd")].some(d => / ms$| s$/.test(d.textContent))`)

	// Pause, as someone reading the list would (under this load the newest
	// 40 decisions turn over in a second or two), and click a placement:
	// every candidate with its terms.
	if err := do(ctx, chromedp.Click("#pause")); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "paused", `document.getElementById("live-text").textContent === "paused"`)
	id := waitJS[string](t, ctx, "placements listed", `document.querySelector('#dlist tr[data-outcome="bound"]')?.dataset.id`)
	if err := do(ctx, chromedp.Click(fmt.Sprintf(`#dlist tr[data-id=%q]`, id))); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the clicked decision's breakdown", fmt.Sprintf(`document.querySelector("#detail h3")?.dataset.decision === %q && document.querySelectorAll("#detail .cand").length === %d`, id, workers))
	waitJS[bool](t, ctx, "terms with raw, norm, weighted, source", `(() => { const rows = document.querySelectorAll("#detail .cand.chosen tr.term"); return rows.length >= 5 && [...rows].every(r => r.children.length === 7); })()`)

	if err := do(ctx, chromedp.Click("#pause")); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "live again", `document.getElementById("live-text").textContent === "live"`)
	admitted = intText(t, ctx, "sum-admitted")
	waitJS[bool](t, ctx, "counting again after the pause", fmt.Sprintf(`+document.getElementById("sum-admitted").textContent > %d`, admitted))

	dir := artifactDir(t)
	screenshot(t, ctx, 1400, filepath.Join(dir, "dashboard-under-load.png"))
	// In a narrow window nothing is cut off sideways.
	screenshot(t, ctx, 420, filepath.Join(dir, "dashboard-narrow.png"))
	if w := waitJS[int](t, ctx, "layout", `document.documentElement.scrollWidth`); w > 420 {
		t.Errorf("at 420 px wide the page is %d px wide: it scrolls sideways", w)
	}
	if err := do(ctx, chromedp.EmulateViewport(1400, 1000)); err != nil {
		t.Fatal(err)
	}

	// The load stops: the page follows it down without a reload.
	l.stop()
	waitJS[bool](t, ctx, "nothing in flight or queued", `document.getElementById("sum-active").textContent === "0" && document.getElementById("sum-queued").textContent === "0" && [...document.querySelectorAll("#cards .card")].every(c => c.dataset.active === "0")`)
	st := l.statuses()
	if st[200] == 0 || st[429] == 0 {
		t.Errorf("load statuses %v: want both 200s and 429s", st)
	}
	if len(l.errs) > 0 {
		t.Errorf("%d load requests failed, first: %v", len(l.errs), l.errs[0])
	}
	if got := intText(t, ctx, "sum-429"); got != st[429] {
		t.Errorf("page counts %d 429s, the clients saw %d", got, st[429])
	}
}

// TestDashboard_PagesAFleetOfHundreds checks that a large fleet comes a
// page of cards at a time, that paging, sorting and filtering work in the
// page, and that the charts still show the busiest few workers only.
func TestDashboard_PagesAFleetOfHundreds(t *testing.T) {
	const idle = 299
	ctx := newBrowser(t, 1400, 1000)
	r := startRouter(t, 1, 5, func(c *config.Config) {
		c.Telemetry.Interval = time.Second
		for i := range idle {
			// Nothing listens on port 1: these workers go down.
			c.Workers = append(c.Workers, config.Worker{Name: fmt.Sprintf("idle-%03d", i), URL: "http://127.0.0.1:1",
				Kind: "llamacpp", Models: c.Workers[0].Models})
		}
	})
	if err := do(ctx, chromedp.Navigate(r.url+"/")); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the first page", `document.getElementById("page-info").textContent === "1–24 of 300" && document.querySelectorAll("#cards .card").length === 24`)
	waitJS[bool](t, ctx, "the fleet counted whole", `document.getElementById("sum-workers").textContent === "300"`)
	if err := do(ctx, chromedp.Click("#next")); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the second page", `document.getElementById("page-info").textContent === "25–48 of 300" && document.querySelector("#cards .card").dataset.worker === "idle-023"`)
	if err := do(ctx, chromedp.SetValue("#sort", "trouble"), chromedp.Evaluate[chromedp.Void](`document.getElementById("sort").dispatchEvent(new Event("change"))`)); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "trouble first, back on page one", `document.getElementById("page-info").textContent === "1–24 of 300" && document.querySelector("#cards .card").dataset.health !== "ok"`)
	if err := do(ctx, chromedp.SendKeys("#filter", "gpu-")); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the filter", `document.getElementById("page-info").textContent === "1–1 of 1" && document.querySelector("#cards .card").dataset.worker === "gpu-0"`)
	waitJS[bool](t, ctx, "a bounded concurrency chart", `document.querySelectorAll("#lg-conc span").length === 8`)

	// A decision lists all 300 candidates: its breakdown, like the list,
	// stays within the window (1000 px high) and scrolls inside itself.
	if resp, body, err := r.chat(context.Background(), http.DefaultClient, false, 4); err != nil || resp.StatusCode != 200 {
		t.Fatalf("request: %v %v %s", err, resp, body)
	}
	waitJS[bool](t, ctx, "the newest decision's breakdown", `document.querySelectorAll("#detail .cand").length === 300`)
	for _, sel := range []string{"#detail", ".dlist-wrap"} {
		waitJS[bool](t, ctx, sel+" within the window", fmt.Sprintf(`(() => { const d = document.querySelector(%q), cs = getComputedStyle(d); return (cs.overflowY === "auto" || cs.overflowY === "scroll") && d.getBoundingClientRect().height <= innerHeight; })()`, sel))
	}
	waitJS[bool](t, ctx, "the breakdown scrolls to its last candidate", `(() => { const d = document.getElementById("detail"); d.scrollTop = d.scrollHeight; const last = [...d.querySelectorAll(".cand")].pop().getBoundingClientRect(), box = d.getBoundingClientRect(); return d.scrollTop > 0 && last.bottom <= box.bottom + 1 && last.top >= box.top - 1; })()`)
}

// longReason is a limit explanation longer than a card's two lines, as
// the scheduler writes them when it borrows under a backlog.
const longReason = "6: at 7 streams the slowest decode 35.9 tok/s (p16), under the floor 36.5; probing from 7 streams (1 samples there so far); floor 36.5 tok/s, half the best solo rate 73.0 tok/s of gpu-b; borrowing +1: the oldest queued request waited 2.3s"

// TestDashboard_ShowsLimitReasonAndSendsToken serves the page's own
// assets with a canned overview: the page must render fields the
// scheduler may report beyond today's (where a worker's limit came from
// and why), and send an admin token given as #token=… on every call
// without leaving it in the address bar.
func TestDashboard_ShowsLimitReasonAndSendsToken(t *testing.T) {
	ctx := newBrowser(t, 1200, 900)
	d := dashboard.New(dashboard.Options{Workers: func() []scheduler.WorkerState { return nil }})
	const token = "s3cret-token"
	var unauth atomic.Int64
	needToken := func(h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Header.Get("Authorization") != "Bearer "+token {
				unauth.Add(1)
				proxy.WriteError(w, http.StatusUnauthorized, "invalid_admin_token", "admin routes need Authorization: Bearer <admin token>")
				return
			}
			h(w, r)
		}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", d.Index)
	mux.Handle("GET /dashboard/", d.Assets())
	mux.HandleFunc("GET /api/overview", needToken(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, `{"now":12000,"interval_ms":1000,"latency_window_s":10,"window":300,"seq":1,
			"samples":[{"seq":1,"t":1,"queued":0,"active":3,"limit":6,"healthy":1,"admitted":1,"ok":1,"r429":0,"r503":0,"failed":0,"tokens":9}],
			"fleet":{"workers":1,"health":{"ok":1},"draining":0,"active":3,"limit":6,"queued":0},"queues":{"m":0},
			"totals":{"admitted":1,"ok":1,"r429":0,"r503":0,"failed":0,"tokens":9},
			"page":{"offset":0,"limit":24,"total":1,"sort":"config"},
			"workers":[{"name":"gpu-a","health":"ok","draining":false,"models":["m"],"active":3,"active_other_replicas":2,"limit":6,
				"limit_source":"learned","limit_cap":8,"limit_reason":"`+longReason+`",
				"adapters":[{"name":"sql-lora","base":"m","state":"loaded","source":"vllm /v1/models"},{"name":"chat-lora","state":"loading","source":"loading by Sluice"}],
				"limit_moved":{"at":"1970-01-01T00:00:00Z","from":7,"to":6,"why":"slowest stream under the floor"},"sluice_queue":0,"averages":{},"spark":[3],
				"prediction":{"ttft_error":0.12,"decode_error":0.41,"ttft_n":32,"decode_n":32,"trusted":false,"untrusted":"median decode prediction error 41% over the last 32 > 30%"}}],
			"busiest":[{"name":"gpu-a","limit":6,"active":[3]}],
			"decisions":[{"id":"d-1","time":"2026-01-02T03:04:05Z","model":"m","outcome":"bound","chosen":"gpu-a","attempt":2,"queue_wait_ms":0,
				"continuation":{"from":"gpu-b","reason":"upstream_failed","carried_tokens":40,"gap_ms":83,"outcome":"ok"}}]}`)
	}))
	mux.HandleFunc("GET /debug/decisions/{id}", needToken(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"time":"2026-01-02T03:04:05Z","model":"m","policy":"sluice","attempt":1,"outcome":"bound","chosen":"gpu-a",
			"reason":"only eligible worker","candidates":[{"worker":"gpu-a","eligible":true,"active":2,"limit":6,"total":200,"rank":1,
			"terms":[{"name":"active_requests","raw":2,"norm":2,"weight":100,"weighted":200,"source":"sluice in-flight count"}]}]}`, r.PathValue("id"))
	}))
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// Without the token the page says what it needs.
	if err := do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "a banner asking for the token", `/admin token/.test(document.getElementById("banner").textContent) && !document.getElementById("banner").hidden`)

	if err := do(ctx, chromedp.Navigate(srv.URL+"/#token="+token)); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the decision that continued a broken stream, with a badge saying from where", `(() => { const b = document.querySelector('tr[data-id="d-1"] .cont'); return b && /from gpu-b/.test(b.textContent) && /40 tokens carried over/.test(b.title); })()`)
	waitJS[bool](t, ctx, "the card with how far its forecasts were off, in words", `(() => { const n = document.querySelector('#cards .card[data-worker="gpu-a"] .prednote summary'); return n && n.textContent === "forecasts off: first token 12%, decode 41% · not relied on"; })()`)
	// The card says where its limit came from in a line; the reason is
	// one click away, and stays shown across refreshes once opened.
	note := `document.querySelector('#cards .card[data-worker="gpu-a"] .limitnote')`
	waitJS[bool](t, ctx, "the card with its limit's source in words", `(() => { const n = `+note+`; return n && n.querySelector("summary").textContent === "limit 6 · learned from its measured speed (at most 8)" && !n.open; })()`)
	if err := do(ctx, chromedp.Click(`#cards .card[data-worker="gpu-a"] .limitnote summary`)); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the whole reason shown after a click", `(() => { const n = `+note+`; n.dataset.seen = "1"; return n.open && n.querySelector(".more").textContent.includes(`+strconv.Quote(longReason)+`); })()`)
	waitJS[bool](t, ctx, "still shown after the card is drawn again", `(() => { const n = `+note+`; return !n.dataset.seen && n.open; })()`)
	if err := do(ctx, chromedp.Click(`#cards .card[data-worker="gpu-a"] .prednote summary`)); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "why the forecasts are not relied on, after a click", `(() => { const n = document.querySelector('#cards .card[data-worker="gpu-a"] .prednote'); return n.open && /median decode prediction error 41% over the last 32 > 30%/.test(n.textContent); })()`)
	if bad := truncated(t, ctx); len(bad) > 0 {
		t.Errorf("text cut off at 1200 px:\n%s", strings.Join(bad, "\n"))
	}
	waitJS[bool](t, ctx, "in flight across replicas against the limit", `(() => { const c = document.querySelector('#cards .card[data-worker="gpu-a"]'), n = c.querySelector('[data-k="active"]'); return c.dataset.active === "5" && /^5\/6$/.test(n.textContent) && /3 from this replica, 2 from the others/.test(n.title); })()`)
	waitJS[bool](t, ctx, "the card's line of LoRA adapters", `(() => { const n = document.querySelector('#cards .card[data-worker="gpu-a"] .adapters'); return n && n.textContent === "LoRA sql-lora, chat-lora (loading)" && /sql-lora — loaded, vllm \/v1\/models/.test(n.title); })()`)
	waitJS[bool](t, ctx, "when the limit last moved", `/moved 7→6 12 s ago/.test(document.querySelector('#cards .card[data-worker="gpu-a"]').textContent)`)
	waitJS[bool](t, ctx, "the banner gone", `document.getElementById("banner").hidden`)
	waitJS[bool](t, ctx, "the newest placement explained", `document.querySelector("#detail h3")?.dataset.decision === "d-1" && document.querySelectorAll("#detail tr.term").length === 1`)
	if loc := waitJS[string](t, ctx, "location", `location.href`); strings.Contains(loc, token) {
		t.Errorf("the token stays in the address bar: %s", loc)
	}
	before := unauth.Load()
	waitJS[bool](t, ctx, "polling goes on", `document.getElementById("live-text").textContent === "live"`)
	if err := do(ctx, chromedp.Reload()); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the tab remembers the token", `document.querySelector('#cards .card[data-worker="gpu-a"]') !== null && document.getElementById("banner").hidden`)
	if n := unauth.Load() - before; n != 0 {
		t.Errorf("%d calls went without the token after it was given", n)
	}
}

// TestDashboard_TTFTIsTheClientsWithTheWorkersShareBeside serves the
// page's own assets with a canned overview in which requests waited 13 s
// in Sluice for a worker that took 0.3 s to its first token: the TTFT
// chart must be labelled as the client's view and carry the workers' share
// as a second, dashed figure; a decision must show its queue wait, its
// TTFT and the worker's share, filled in when its first token comes after
// the decision was first shown, whether the decision is still listed then
// or not.
func TestDashboard_TTFTIsTheClientsWithTheWorkersShareBeside(t *testing.T) {
	ctx := newBrowser(t, 1400, 1000)
	d := dashboard.New(dashboard.Options{Workers: func() []scheduler.WorkerState { return nil }})
	var firstToken, oldFirstToken atomic.Bool // d-9's and d-7's requests have relayed their first token
	ttftFields := func(id string) string {
		if (id == "d-9" && firstToken.Load()) || (id == "d-7" && oldFirstToken.Load()) {
			return `"ttft_ms":13300,"worker_ttft_ms":408,`
		}
		return ""
	}
	var detailFetches atomic.Int64
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", d.Index)
	mux.Handle("GET /dashboard/", d.Assets())
	mux.HandleFunc("GET /api/overview", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"now":3000,"interval_ms":1000,"latency_window_s":10,"window":300,"seq":3,
			"samples":[
				{"seq":1,"t":1000,"queued":40,"active":4,"limit":4,"healthy":1,"admitted":1,"ok":1,"r429":0,"r503":0,"failed":0,"tokens":9,
				 "ttft_ms":{"p50":12000,"p95":12500,"p99":12900,"n":5},"worker_ttft_ms":{"p50":280,"p95":390,"p99":400,"n":5}},
				{"seq":2,"t":2000,"queued":40,"active":4,"limit":4,"healthy":1,"admitted":1,"ok":1,"r429":0,"r503":0,"failed":0,"tokens":9,
				 "ttft_ms":{"p50":13000,"p95":13200,"p99":13300,"n":6},"worker_ttft_ms":{"p50":300,"p95":400,"p99":408,"n":6}},
				{"seq":3,"t":3000,"queued":40,"active":4,"limit":4,"healthy":1,"admitted":1,"ok":1,"r429":0,"r503":0,"failed":0,"tokens":9,
				 "ttft_ms":{"p50":13100,"p95":13200,"p99":13300,"n":7},"worker_ttft_ms":{"p50":300,"p95":400,"p99":408,"n":7}}],
			"fleet":{"workers":1,"health":{"ok":1},"draining":0,"active":4,"limit":4,"queued":40},"queues":{"m":40},
			"totals":{"admitted":3,"ok":3,"r429":0,"r503":0,"failed":0,"tokens":27},
			"page":{"offset":0,"limit":24,"total":0,"sort":"config"},"workers":[],"busiest":[],
			"decisions":[{"id":"d-9","time":"2026-01-02T03:04:05Z","model":"m","outcome":"bound","chosen":"gpu-a","attempt":1,%s"queue_wait_ms":12900}]}`, ttftFields("d-9"))
	})
	mux.HandleFunc("GET /debug/decisions/{id}", func(w http.ResponseWriter, r *http.Request) {
		detailFetches.Add(1)
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprintf(w, `{"id":%q,"time":"2026-01-02T03:04:05Z","model":"m","policy":"sluice","attempt":1,"outcome":"bound","chosen":"gpu-a",
			"queue_wait_ms":12900,"queue_depth":39,%s"reason":"only eligible worker","candidates":[{"worker":"gpu-a","eligible":true,"active":3,"limit":4,"total":300,"rank":1,
			"terms":[{"name":"active_requests","raw":3,"norm":3,"weight":100,"weighted":300,"source":"sluice in-flight count"}]}]}`, r.PathValue("id"), ttftFields(r.PathValue("id")))
	})
	srv := httptest.NewServer(mux)
	defer srv.Close()
	if err := do(ctx, chromedp.Navigate(srv.URL+"/")); err != nil {
		t.Fatal(err)
	}

	waitJS[bool](t, ctx, "the chart labelled as the client's view", `/as clients see it/.test(document.querySelector("#ch-ttft").closest("figure").querySelector("figcaption").textContent) && /dashed: the workers' share/.test(document.getElementById("ttft-note").textContent) && /from a request's arrival at Sluice to its first token, queueing included/.test(document.querySelector("#ch-ttft").closest("figure").title)`)
	for _, c := range []struct{ what, selector, want string }{
		{"client p50 first in the stat line", `#lg-ttft span:first-child`, "p50 13.1 s"},
		{"client p99", `#lg-ttft span:nth-child(2)`, "p99 13.3 s"},
		{"the workers' p50 beside it", `#lg-ttft span[data-k="worker"]:nth-child(3)`, "worker p50 300 ms"},
		{"the workers' p99 beside it", `#lg-ttft span[data-k="worker"]:nth-child(4)`, "worker p99 408 ms"},
	} {
		waitJS[bool](t, ctx, c.what, fmt.Sprintf(`document.querySelector(%q)?.textContent.trim() === %q`, c.selector, c.want))
	}
	waitJS[bool](t, ctx, "the workers' share drawn dashed", `document.querySelectorAll("#ch-ttft path[stroke-dasharray]").length === 2 && document.querySelectorAll("#ch-ttft path:not([stroke-dasharray])").length === 2`)

	// Before its first token the decision shows its wait and says the
	// TTFTs are not known yet.
	waitJS[bool](t, ctx, "the decision before its first token", `(() => {
		const f = (k) => document.querySelector('#detail .facts [data-k="' + k + '"] b')?.textContent;
		return document.querySelector("#detail h3")?.dataset.decision === "d-9" && f("queue") === "12.9 s" && f("ttft") === "–" && f("worker-ttft") === "–" &&
			document.querySelector('#dlist tr[data-id="d-9"] td[data-k="ttft"]').textContent === "–";
	})()`)
	before := detailFetches.Load()
	firstToken.Store(true)
	waitJS[bool](t, ctx, "the list row's TTFT, with the worker's share on hover", `(() => { const c = document.querySelector('#dlist tr[data-id="d-9"] td[data-k="ttft"]'); return c.textContent === "13.3 s" && /worker's share 408 ms/.test(c.title); })()`)
	waitJS[bool](t, ctx, "the decision's TTFT as the client saw it beside the worker's share", `(() => {
		const f = (k) => document.querySelector('#detail .facts [data-k="' + k + '"]');
		return f("queue")?.querySelector("b").textContent === "12.9 s" &&
			f("ttft")?.textContent === "TTFT (client) 13.3 s" && /from arrival at Sluice/.test(f("ttft").title) &&
			f("worker-ttft")?.textContent === "worker TTFT 408 ms" && /from sending to it/.test(f("worker-ttft").title);
	})()`)
	if n := detailFetches.Load() - before; n != 1 {
		t.Errorf("the decision was fetched %d times once its first token was listed; want once", n)
	}

	// An older decision, no longer listed, found by its id while its
	// request is in flight: its detail is fetched once more at the next
	// list update. Paused, the page makes none until resumed.
	if err := do(ctx, chromedp.Click("#pause"), chromedp.SendKeys("#search-id", "d-7"), chromedp.Click("#search button")); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the older decision before its first token", `document.querySelector("#detail h3")?.dataset.decision === "d-7" && document.querySelector('#detail .facts [data-k="ttft"] b')?.textContent === "–"`)
	oldFirstToken.Store(true)
	if err := do(ctx, chromedp.Click("#pause")); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the older decision's TTFTs", `document.querySelector("#detail h3")?.dataset.decision === "d-7" && document.querySelector('#detail .facts [data-k="ttft"] b')?.textContent === "13.3 s" && document.querySelector('#detail .facts [data-k="worker-ttft"] b')?.textContent === "408 ms"`)
}

// truncatedJS lists the text the page cuts off: text clipped by an
// ancestor that hides or scrolls its overflow sideways (a table wider than
// its pane), or cut at the bottom by one that hides it; text ellipsised or
// line-clamped; and text spilling out of its card, chart or section. Text
// inside a closed <details> is not drawn and not counted; a pane that
// scrolls vertically may hold rows below its fold.
const truncatedJS = `(() => {
	const bad = [];
	const where = (el) => {
		const c = el.closest("[id], [data-worker], [data-id], [data-chart]");
		return (c ? (c.id || c.dataset.worker || c.dataset.id || c.dataset.chart) + " " : "") + el.tagName.toLowerCase() + (el.className && el.className.baseVal === undefined ? "." + el.className : "");
	};
	const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
	for (let n = walker.nextNode(); n; n = walker.nextNode()) {
		const text = n.textContent.trim();
		const el = n.parentElement;
		if (!text || !el || el.closest("script, style")) continue;
		const r = document.createRange();
		r.selectNodeContents(n);
		const rects = [...r.getClientRects()].filter((q) => q.width > 0 && q.height > 0);
		if (!rects.length) continue; // not drawn
		const cs = getComputedStyle(el);
		const say = (why) => bad.push(where(el) + " " + JSON.stringify(text.slice(0, 80)) + ": " + why);
		if (cs.textOverflow === "ellipsis" && el.scrollWidth > el.clientWidth + 1) { say("ellipsised"); continue; }
		if (cs.webkitLineClamp && cs.webkitLineClamp !== "none" && el.scrollHeight > el.clientHeight + 1) { say("line-clamped"); continue; }
		let cut = "";
		for (let a = el; a && a !== document.documentElement && !cut; a = a.parentElement) {
			const s = getComputedStyle(a);
			const box = a.getBoundingClientRect();
			const left = box.left + a.clientLeft, right = left + (a.clientWidth || box.width), top = box.top + a.clientTop, bottom = top + (a.clientHeight || box.height);
			const scrollsY = s.overflowY === "auto" || s.overflowY === "scroll";
			for (const q of rects) {
				if (s.overflowX !== "visible" && (q.right > right + 1 || q.left < left - 1)) cut = "cut at the side by " + where(a);
				else if (s.overflowY !== "visible" && !scrollsY && (q.bottom > bottom + 1 || q.top < top - 1)) cut = "cut at the bottom by " + where(a);
			}
		}
		if (cut) { say(cut); continue; }
		const box = el.closest(".card, .chart, section, .chip, .top");
		if (box) {
			const b = box.getBoundingClientRect();
			if (rects.some((q) => q.right > b.right + 1 || q.left < b.left - 1)) say("spills out of " + where(box));
		}
	}
	if (document.documentElement.scrollWidth > innerWidth + 1) bad.push("the page scrolls sideways: " + document.documentElement.scrollWidth + " px in " + innerWidth);
	return bad;
})()`

// truncated returns the text the page cuts off now (truncatedJS).
func truncated(t *testing.T, ctx context.Context) []string {
	t.Helper()
	ectx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	bad, err := chromedp.Run(ectx, chromedp.Evaluate[[]string](truncatedJS))
	if err != nil {
		t.Fatal(err)
	}
	return bad
}

// chartAxes reads each chart's y-axis unit and tick labels and its x-axis
// tick labels.
type chartAxis struct {
	Chart string   `json:"chart"`
	Unit  string   `json:"unit"`
	Y     []string `json:"y"`
	X     []string `json:"x"`
}

func chartAxes(t *testing.T, ctx context.Context) []chartAxis {
	t.Helper()
	ectx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	axes, err := chromedp.Run(ectx, chromedp.Evaluate[[]chartAxis](`[...document.querySelectorAll("svg[data-chart]")].map((s) => ({
		chart: s.dataset.chart, unit: s.querySelector("text.unit")?.textContent || "",
		y: [...s.querySelectorAll("text.ytick")].map((e) => e.textContent), x: [...s.querySelectorAll("text.xtick")].map((e) => e.textContent)}))`))
	if err != nil {
		t.Fatal(err)
	}
	return axes
}

var (
	yTick = regexp.MustCompile(`^\d+(\.(\d+))?$`)
	xTick = regexp.MustCompile(`^(now|−(\d+s|\d+m(\d+s)?))$`)
)

// checkAxes fails the test for a chart whose y axis has no unit or labels
// that are not plain numbers in it with one precision, or whose x labels
// carry no unit.
func checkAxes(t *testing.T, axes []chartAxis, size string) {
	t.Helper()
	units := map[string][]string{"queue": {"requests"}, "admit": {"per s"}, "refuse": {"per s"}, "ttft": {"ms", "s"}, "tpot": {"ms", "s"}, "conc": {"requests"}}
	if got, want := len(axes), len(units); got != want {
		t.Errorf("%s: %d charts, want %d", size, got, want)
	}
	for _, a := range axes {
		if !slices.Contains(units[a.Chart], a.Unit) {
			t.Errorf("%s: chart %s's y axis is in %q, want one of %q", size, a.Chart, a.Unit, units[a.Chart])
		}
		if len(a.Y) < 2 || len(a.X) < 2 {
			t.Errorf("%s: chart %s has y labels %q and x labels %q, want at least two of each", size, a.Chart, a.Y, a.X)
		}
		digits := -1
		for _, y := range a.Y {
			m := yTick.FindStringSubmatch(y)
			if m == nil {
				t.Errorf("%s: chart %s has y label %q: want a plain number in %s", size, a.Chart, y, a.Unit)
				continue
			}
			if digits >= 0 && len(m[2]) != digits {
				t.Errorf("%s: chart %s's y labels %q mix precisions", size, a.Chart, a.Y)
			}
			digits = len(m[2])
		}
		for _, x := range a.X {
			if !xTick.MatchString(x) {
				t.Errorf("%s: chart %s has x label %q: want now or a time ago with its unit", size, a.Chart, x)
			}
		}
	}
}

// TestDashboard_ReadsWhole renders the dashboard in front of a fleet
// whose queue fills at 1280×800, 1920×1080 and 1000×800: no text is cut
// off, every axis says its unit, the legends draw no p95 (over tens of
// requests it is p99), a request held in the queue says so in the list
// and in its breakdown, and each card's notes open to their whole text.
// It leaves a screenshot of each size in $SLUICE_ARTIFACTS (or a
// temporary directory): look at them.
func TestDashboard_ReadsWhole(t *testing.T) {
	const workers = 4
	ctx := newBrowser(t, 1280, 800)
	r := startRouter(t, workers, 5, nil)
	if err := do(ctx, chromedp.Navigate(r.url+"/")); err != nil {
		t.Fatal(err)
	}
	// More clients than the fleet's slots: requests wait in the queue.
	l := r.startLoad(t, 28, 5000)
	waitJS[bool](t, ctx, "a request held in the queue, then placed", `document.querySelector("#dlist tr.held") !== null && +document.getElementById("sum-held").textContent > 0`)
	waitJS[bool](t, ctx, "cards with averages, limits, forecasts and scores", `[...document.querySelectorAll("#cards .card")].every((c) => / ms$| s$/.test(c.querySelector('[data-k="worker-ttft"]').textContent) && c.querySelector(".limitnote") && c.querySelector(".prednote") && c.querySelector(".sbar span[title]"))`)
	waitJS[bool](t, ctx, "latency charts with lines", `document.querySelectorAll("#ch-ttft path").length >= 2 && document.querySelectorAll("#ch-tpot path").length >= 2`)
	// The breakdown of a held request says what happened in words.
	id := waitJS[string](t, ctx, "a held decision", `document.querySelector("#dlist tr.held")?.dataset.id`)
	if err := do(ctx, chromedp.Click("#pause"), chromedp.Click(fmt.Sprintf(`#dlist tr[data-id=%q]`, id))); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the held request's story", fmt.Sprintf(`document.querySelector("#detail h3")?.dataset.decision === %q && /^Held [\d.]+ m?s in Sluice's queue rather than overload a card.*, then sent to \S+ when it had room\.$/.test(document.querySelector("#detail .story.held")?.textContent)`, id))
	waitJS[bool](t, ctx, "the held row says where it went", fmt.Sprintf(`/^held, then \S+/.test(document.querySelector('#dlist tr[data-id=%q] td[data-k="where"]').textContent)`, id))
	// One card's notes open, as a reader would (in mid-window: the sticky
	// header covers the top).
	if err := do(ctx, chromedp.Evaluate[chromedp.Void](`document.querySelector("#cards .card").scrollIntoView({block: "center"})`),
		chromedp.Click(`#cards .card .limitnote summary`), chromedp.Click(`#cards .card .prednote summary`)); err != nil {
		t.Fatal(err)
	}
	waitJS[bool](t, ctx, "the notes open", `document.querySelector("#cards .card .limitnote").open && document.querySelector("#cards .card .prednote").open`)
	if legend := waitJS[string](t, ctx, "legends", `[...document.querySelectorAll(".legend")].map((l) => l.textContent).join(" | ")`); strings.Contains(legend, "p95") {
		t.Errorf("a legend shows p95: %s", legend)
	}

	dir := artifactDir(t)
	for _, size := range []struct{ w, h int64 }{{1280, 800}, {1920, 1080}, {1000, 800}} {
		name := fmt.Sprintf("%dx%d", size.w, size.h)
		if err := do(ctx, chromedp.EmulateViewport(size.w, size.h)); err != nil {
			t.Fatal(err)
		}
		if err := do(ctx, chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`)); err != nil {
			t.Fatal(err)
		}
		waitJS[bool](t, ctx, "charts drawn at "+name, `(() => { const s = document.getElementById("ch-queue"); return Math.abs(s.viewBox.baseVal.width - s.clientWidth) < 2; })()`)
		if bad := truncated(t, ctx); len(bad) > 0 {
			t.Errorf("at %s text is cut off:\n%s", name, strings.Join(bad, "\n"))
		}
		checkAxes(t, chartAxes(t, ctx), name)
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		png, err := chromedp.Run(sctx, chromedp.CaptureScreenshot())
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, "dashboard-"+name+".png")
		if err := os.WriteFile(path, png, 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("screenshot: %s", path)
		screenshot(t, ctx, size.w, filepath.Join(dir, "dashboard-"+name+"-whole-page.png"))
	}
	l.stop()
}
