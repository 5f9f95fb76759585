package main

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/stats"
)

// startChild starts this test binary again as a router serving cfgPath
// (TestServe_SignalChild), kills it when the test ends, and follows its
// log.
func startChild(t *testing.T, cfgPath string) (*exec.Cmd, *logLines) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestServe_SignalChild$", "-test.v=false")
	cmd.Env = append(os.Environ(), childEnv+"="+cfgPath)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	return cmd, followLog(stderr)
}

// childEnv names the config a re-executed test binary serves.
const childEnv = "SLUICE_TEST_SERVE_CONFIG"

// TestServe_SignalChild is not a test: it is the router process that
// TestServe_SignalsDrainReloadAndPersist starts, by running this test
// binary again with childEnv set, so real signals reach a real process.
func TestServe_SignalChild(t *testing.T) {
	path := os.Getenv(childEnv)
	if path == "" {
		t.Skip("runs only as the child of TestServe_SignalsDrainReloadAndPersist")
	}
	if err := runServe([]string{"--config", path}); err != nil {
		fmt.Fprintln(os.Stderr, "serve:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

// holdWorker streams a short answer; a request with user "hold" waits
// until release is closed.
func holdWorker(t *testing.T, arrived chan<- string, release <-chan struct{}) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			io.WriteString(w, `{"object":"list","data":[{"id":"m","object":"model"}]}`)
			return
		}
		var body struct{ User string }
		json.NewDecoder(r.Body).Decode(&body)
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n")
		w.(http.Flusher).Flush()
		if body.User == "hold" {
			arrived <- body.User
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		io.WriteString(w, "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\ndata: [DONE]\n\n")
	}))
	t.Cleanup(srv.Close)
	return srv
}

// logLines follows a child's stderr and hands out the lines it wants.
type logLines struct {
	lines chan string
	seen  strings.Builder
}

func followLog(r io.Reader) *logLines {
	l := &logLines{lines: make(chan string, 1024)}
	go func() {
		sc := bufio.NewScanner(r)
		for sc.Scan() {
			l.lines <- sc.Text()
		}
		close(l.lines)
	}()
	return l
}

// waitLine returns the first line containing want, failing after 30 s
// (a safety bound) or when the child's stderr ends.
func (l *logLines) waitLine(t *testing.T, want string) string {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case line, ok := <-l.lines:
			if !ok {
				t.Fatalf("child exited before logging %q; its log:\n%s", want, l.seen.String())
			}
			l.seen.WriteString(line + "\n")
			if strings.Contains(line, want) {
				return line
			}
		case <-timeout:
			t.Fatalf("child did not log %q in 30s; its log:\n%s", want, l.seen.String())
		}
	}
}

func TestServe_SignalsDrainReloadAndPersist(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in the child")
	}
	arrived := make(chan string, 1)
	release := make(chan struct{})
	worker := holdWorker(t, arrived, release)
	dir := t.TempDir()
	store := filepath.Join(dir, "stats.db")
	cfgPath := filepath.Join(dir, "sluice.yaml")
	base := fmt.Sprintf(`listen: 127.0.0.1:0
workers: [{name: w1, url: %q, kind: openai, models: [m], max_concurrency: 4}]
stats: {store: %q}
telemetry: {interval: 1h, stale_after: 1h}
shutdown: {drain_delay: 3s, grace: 20s}
`, worker.URL, store)
	if err := os.WriteFile(cfgPath, []byte(base), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, log := startChild(t, cfgPath)
	m := regexp.MustCompile(`addr=(\S+)`).FindStringSubmatch(log.waitLine(t, "sluice listening"))
	if m == nil {
		t.Fatal("no addr in the listening line")
	}
	url := "http://" + m[1]

	post := func(user, key string) (int, string, error) {
		req, _ := http.NewRequestWithContext(context.Background(), "POST", url+"/v1/chat/completions",
			strings.NewReader(fmt.Sprintf(`{"model":"m","stream":true,"user":%q,"messages":[{"role":"user","content":"hi"}]}`, user)))
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, string(b), err
	}
	type result struct {
		status int
		body   string
		err    error
	}
	held := make(chan result, 1)
	go func() {
		s, b, err := post("hold", "")
		held <- result{s, b, err}
	}()
	<-arrived

	// SIGHUP with a key added: the held request is not disturbed, and new
	// requests need the key.
	sum := sha256.Sum256([]byte("sk-reloaded"))
	withKey := base + fmt.Sprintf("auth: {keys: [{key_sha256: %q, tenant: t1}]}\n", hex.EncodeToString(sum[:]))
	if err := os.WriteFile(cfgPath, []byte(withKey), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Process.Signal(syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	log.waitLine(t, "config reloaded")
	if s, b, err := post("anon", ""); err != nil || s != http.StatusUnauthorized {
		t.Fatalf("after reload without a key: %d %s %v, want 401", s, b, err)
	}
	if s, b, err := post("keyed", "sk-reloaded"); err != nil || s != 200 || !strings.Contains(b, "[DONE]") {
		t.Fatalf("after reload with the new key: %d %s %v", s, b, err)
	}

	// SIGTERM: /readyz turns 503 while the held request goes on.
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	log.waitLine(t, "/readyz now answers 503")
	resp, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatalf("during the drain delay the router must still accept: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("X-Sluice-Reason") != "shutting_down" {
		t.Fatalf("/readyz while draining: %d %q", resp.StatusCode, resp.Header.Get("X-Sluice-Reason"))
	}
	log.waitLine(t, "no longer accepting")
	close(release)
	if r := <-held; r.err != nil || r.status != 200 || !strings.Contains(r.body, "[DONE]") {
		t.Fatalf("request in flight across SIGHUP and SIGTERM: %+v", r)
	}
	log.waitLine(t, "every request finished")
	for range log.lines { // drain stderr so Wait can finish
	}
	if err := cmd.Wait(); err != nil {
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			t.Fatalf("exit code %d, want 0; log:\n%s", ee.ExitCode(), log.seen.String())
		}
		t.Fatal(err)
	}
	// The averages were persisted (the last flush on the way out:
	// TestTracker_RunFlushesOnceMoreWhenItEnds).
	st, err := stats.OpenBolt(store, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	got, err := st.Load(context.Background(), []string{"w1"})
	if err != nil {
		t.Fatal(err)
	}
	if w, ok := got["w1"]; !ok || w.E2EMs.N < 2 {
		t.Fatalf("persisted stats %+v, want w1 with the 2 finished requests", got)
	}
}

// TestServe_CtrlCWithNothingInFlightStopsAtOnce checks the signal wiring
// of Ctrl-C: SIGINT to an idle router ends it without the drain delay
// (set to an hour here, so a router that waited it would never exit).
func TestServe_CtrlCWithNothingInFlightStopsAtOnce(t *testing.T) {
	if os.Getenv(childEnv) != "" {
		t.Skip("in the child")
	}
	worker := holdWorker(t, make(chan string, 1), make(chan struct{}))
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "sluice.yaml")
	cfg := fmt.Sprintf(`listen: 127.0.0.1:0
workers: [{name: w1, url: %q, kind: openai, models: [m]}]
telemetry: {interval: 1h, stale_after: 1h}
shutdown: {drain_delay: 1h, grace: 1h}
`, worker.URL)
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd, log := startChild(t, cfgPath)
	log.waitLine(t, "sluice listening")
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	log.waitLine(t, "interrupted with nothing in flight, no drain delay")
	log.waitLine(t, "every request finished")
	for range log.lines {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("child: %v; log:\n%s", err, log.seen.String())
	}
}
