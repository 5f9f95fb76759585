// Package redistest starts a real redis-server on a free loopback port for
// tests and stops it when the test ends. Tests that need Redis call Start.
// When no redis-server binary exists on the machine it skips the test,
// saying why, except in CI (the environment variable CI set, as CI
// services and .ci/run set it), where it fails the test: .ci/run installs
// redis-server, so its absence there is a broken run, not a reason to let
// the Redis suites pass unrun.
package redistest

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Options configure a server.
type Options struct {
	// Persist turns on the append-only file with an fsync per write, so a
	// Restart (even after Kill) keeps every acknowledged write. Without
	// it the server keeps nothing on disk.
	Persist bool
}

// Server is a running redis-server owned by one test.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int
	opts Options

	mu   sync.Mutex
	proc *os.Process
	done chan struct{} // closed when proc has exited
}

// startTimeout bounds how long a server may take to accept connections.
const startTimeout = 20 * time.Second

// Start launches redis-server on 127.0.0.1 and registers its stop with
// t.Cleanup.
func Start(t testing.TB, opts Options) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if InCI() {
			t.Fatal("redis-server not installed, and CI is set: the tests that need a real Redis must run in CI (.ci/install-deps installs it)")
		}
		t.Skip("redis-server not installed (apt-get install -y redis-server); skipping the test that needs a real Redis")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir(), opts: opts}
	var lastErr error
	for range 5 { // a free port can be taken between probe and bind
		if s.port, err = freePort(); err != nil {
			t.Fatalf("redistest: free port: %v", err)
		}
		if lastErr = s.launch(); lastErr == nil {
			t.Cleanup(s.Stop)
			return s
		}
	}
	t.Fatalf("redistest: start redis-server: %v", lastErr)
	return nil
}

// InCI reports whether the tests run in CI: the environment variable CI
// is set to anything but "" or "false".
func InCI() bool {
	v := os.Getenv("CI")
	return v != "" && v != "false"
}

// Addr is the server's host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is the server's redis:// URL with database db.
func (s *Server) URL(db int) string { return fmt.Sprintf("redis://%s/%d", s.Addr(), db) }

// Stop shuts the server down gracefully and waits for it to exit. Stopping
// a stopped server does nothing.
func (s *Server) Stop() { s.end(syscall.SIGTERM) }

// Kill ends the server with SIGKILL, as a crash would, and waits for it.
func (s *Server) Kill() { s.end(syscall.SIGKILL) }

// Restart starts the server again on the same port and directory: with
// Persist, it comes back with every acknowledged write.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	deadline := time.Now().Add(startTimeout)
	for {
		err := s.launch()
		if err == nil {
			return
		}
		if time.Now().After(deadline) { // the old socket may linger briefly
			s.t.Fatalf("redistest: restart redis-server: %v", err)
		}
	}
}

func (s *Server) end(sig syscall.Signal) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.proc == nil {
		return
	}
	_ = s.proc.Signal(sig)
	<-s.done
	s.proc, s.done = nil, nil
}

func (s *Server) launch() error {
	args := []string{
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--dir", s.dir, "--save", "", "--daemonize", "no", "--loglevel", "warning",
		"--logfile", "redis.log", "--protected-mode", "no",
	}
	if s.opts.Persist {
		args = append(args, "--appendonly", "yes", "--appendfsync", "always")
	} else {
		args = append(args, "--appendonly", "no")
	}
	cmd := exec.Command(s.bin, args...)
	cmd.Dir = s.dir
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("exec %s: %w", s.bin, err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cmd.Wait(); close(done) }()
	deadline := time.NewTimer(startTimeout)
	defer deadline.Stop()
	for {
		if ping(s.Addr()) == nil {
			s.mu.Lock()
			s.proc, s.done = cmd.Process, done
			s.mu.Unlock()
			return nil
		}
		select {
		case <-done:
			return fmt.Errorf("redis-server exited during start: %v; log: %s", waitErr, s.logTail())
		case <-deadline.C:
			_ = cmd.Process.Kill()
			<-done
			return fmt.Errorf("redis-server did not answer PING on %s within %v; log: %s", s.Addr(), startTimeout, s.logTail())
		case <-time.After(10 * time.Millisecond): // poll for readiness, bounded by deadline
		}
	}
}

// ping sends one PING in the inline protocol and expects +PONG.
func ping(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("PING\r\n")); err != nil {
		return err
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil {
		return err
	}
	if !strings.HasPrefix(line, "+PONG") {
		return fmt.Errorf("PING answered %q", strings.TrimSpace(line))
	}
	return nil
}

func (s *Server) logTail() string {
	b, err := os.ReadFile(s.dir + "/redis.log")
	if err != nil {
		return "(no log)"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
