package server

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/config"
)

// ErrInterrupted is the cause to cancel Serve's context with when a
// person stops the router at a terminal (Ctrl-C, SIGINT), as against an
// orchestrator's SIGTERM. Then no load balancer is waiting to see /readyz
// fail, so the drain delay is skipped when nothing is in flight, and ends
// as soon as nothing is.
var ErrInterrupted = errors.New("interrupted")

// refuseWindow bounds how long, after the grace period, Sluice waits for
// the requests it refused (still queued at the deadline) to get their 503
// before it closes every connection.
const refuseWindow = time.Second

// fileReserve is how many open files the router keeps for itself
// besides client and worker connections: its stores and decision file,
// probes, Redis, KV-event sockets, the listener.
const fileReserve = 128

// maxConnections returns the cap on open client connections:
// server.max_connections, or when that is 0, half of the open files
// fileReserve leaves (each client connection may need one to a worker).
// A router out of files fails everyone: it can neither reach nor probe a
// worker. Connections beyond the cap wait in the kernel's backlog. limit
// is the open-file limit the cap was sized on, 0 when configured or
// unknown (then n is 0: no cap).
func (s *Server) maxConnections() (n int, limit uint64, err error) {
	if n = s.cfg.Server.MaxConnections; n > 0 {
		return n, 0, nil
	}
	limit, err = s.openFiles()
	if err != nil || limit == 0 {
		return 0, 0, err
	}
	const most = 1 << 30 // an unlimited RLIMIT_NOFILE reads as the largest uint64
	return max(1, (int(min(limit, most))-fileReserve)/2), limit, nil
}

// minBodyRate is the slowest average rate, in bytes a second, at which a
// client may send a request body: 1 Mbit/s.
const minBodyRate = 128 << 10

// bodyTimeout is how long a client has to send a request body once its
// headers are in: the time it had for its headers, plus the largest body
// at minBodyRate. Without it a body trickled in holds a connection, a
// goroutine and up to proxy.max_body_bytes for as long as its client likes.
func bodyTimeout(cfg config.Config) time.Duration {
	return cfg.Server.ReadHeaderTimeout + time.Duration(float64(cfg.Proxy.MaxBodyBytes)/minBodyRate*float64(time.Second))
}

// queuedBodies is how many bodies of proxy.max_body_bytes the requests
// waiting in the admission queue may hold between them, across models:
// each keeps its body while it waits. At about four bytes a token that is
// more prompt than most fleets prefill within admission.queue_timeout, so
// it turns away a backlog that would time out anyway, before it costs the
// router its memory.
const queuedBodies = 16

// Serve serves on ln until ctx ends, then shuts down in order:
//
//  1. /readyz answers 503 at once while everything else is still served,
//     for shutdown.drain_delay, so a load balancer takes the router out of
//     rotation before it stops accepting; when ctx was cancelled with
//     ErrInterrupted (Ctrl-C), only while inference requests are in
//     flight, so an idle router stops at once;
//  2. the listener closes and idle connections with it; queued and
//     in-flight requests go on, for up to grace (shutdown.grace when grace
//     is 0);
//  3. requests still queued at the deadline get 503 shutting_down, and
//     every connection still open is closed.
//
// The caller's Close then flushes the averages. The listener is limited
// to server.max_connections (sized to the open-file limit when 0, see
// maxConnections) and serves TLS when tls is configured.
func (s *Server) Serve(ctx context.Context, ln net.Listener, grace time.Duration) error {
	if grace <= 0 {
		grace = s.cfg.Shutdown.Grace
	}
	lim := s.cfg.Server
	switch n, files, err := s.maxConnections(); {
	case err != nil:
		s.log.Warn("client connections are not capped: the open-file limit is unknown; set server.max_connections", "err", err)
	case n > 0:
		if files > 0 {
			s.log.Info("client connections capped at half the open files left (server.max_connections: 0)", "max_connections", n, "open_file_limit", files)
		}
		ln = newLimitListener(ln, n)
	}
	hs := &http.Server{
		Handler:           s.handler,
		ReadHeaderTimeout: lim.ReadHeaderTimeout,
		IdleTimeout:       lim.IdleTimeout,
		MaxHeaderBytes:    lim.MaxHeaderBytes,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelWarn),
	}
	errc := make(chan error, 1)
	if s.cfg.TLS.CertFile != "" {
		cr, err := newCertReloader(s.cfg.TLS, s.log)
		if err != nil {
			ln.Close()
			return err
		}
		hs.TLSConfig = &tls.Config{GetCertificate: cr.GetCertificate, MinVersion: tls.VersionTLS12}
		go func() { errc <- hs.ServeTLS(ln, "", "") }()
	} else {
		go func() { errc <- hs.Serve(ln) }()
	}
	consoleCtx, stopConsole := context.WithCancel(context.Background())
	defer stopConsole()
	go s.runConsole(consoleCtx)
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}
	s.stopping.Store(true)
	delay := s.cfg.Shutdown.DrainDelay
	interrupted := errors.Is(context.Cause(ctx), ErrInterrupted)
	switch {
	case delay <= 0:
	case interrupted && s.inFlight.Load() == 0:
		s.log.Info("shutting down: interrupted with nothing in flight, no drain delay", "grace", grace)
	default:
		s.log.Info("shutting down: /readyz now answers 503", "drain_delay", delay, "grace", grace)
		if err := s.drainDelay(s.after(delay), interrupted, errc); err != nil {
			return err
		}
	}
	s.log.Info("shutting down: no longer accepting; waiting for queued and in-flight requests")
	done := make(chan error, 1)
	go func() { done <- hs.Shutdown(context.Background()) }()
	select {
	case err := <-done:
		s.sched.Close()
		s.log.Info("shut down: every request finished")
		return err
	case <-s.after(grace):
	}
	// Whatever is still queued will not be placed in time, and the streams
	// still running are ended: say so to each.
	s.sched.Close()
	s.proxy.EndStreams()
	select {
	case err := <-done:
		s.log.Warn("shut down at the grace deadline: queued requests got 503 shutting_down, running streams an error event", "grace", grace)
		return err
	case <-s.after(refuseWindow):
	}
	s.log.Warn("shut down at the grace deadline: closing connections still open", "grace", grace)
	err := hs.Close()
	<-done
	return err
}

// drainDelay waits until done fires, or, when interrupted, until nothing
// is in flight either; it returns the listener's error if serving fails
// meanwhile.
func (s *Server) drainDelay(done <-chan time.Time, interrupted bool, errc <-chan error) error {
	var idle <-chan struct{}
	if interrupted {
		idle = s.idle
	}
	for {
		if interrupted && s.inFlight.Load() == 0 {
			s.log.Info("shutting down: nothing in flight any more, drain delay ended")
			return nil
		}
		select {
		case <-done:
			return nil
		case <-idle:
		case err := <-errc:
			return fmt.Errorf("serve: %w", err)
		}
	}
}

// limitListener accepts at most n connections at a time. Beyond that,
// Accept is not called: new connections wait in the kernel's backlog
// (which refuses them once full) until an open one closes. This is the
// semantics of golang.org/x/net/netutil.LimitListener.
type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

func newLimitListener(ln net.Listener, n int) *limitListener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{})}
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
}

func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(c.release)
	return err
}

// certReloader serves the certificate in cert_file and key_file, loading
// them again when either file's modification time or size changes, so a
// renewed certificate is picked up at the next handshake. A renewal that
// fails to load is logged and the previous certificate kept.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	certSig fileSig
	keySig  fileSig
}

type fileSig struct {
	mod  time.Time
	size int64
}

func sigOf(path string) (fileSig, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return fileSig{}, err
	}
	return fileSig{mod: fi.ModTime(), size: fi.Size()}, nil
}

func newCertReloader(cfg config.TLS, log *slog.Logger) (*certReloader, error) {
	c := &certReloader{certFile: cfg.CertFile, keyFile: cfg.KeyFile, log: log}
	if err := c.reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// reload loads the pair if either file changed; mu must be held or the
// reloader not yet shared.
func (c *certReloader) reload() error {
	cs, err := sigOf(c.certFile)
	if err != nil {
		return fmt.Errorf("tls.cert_file: %w", err)
	}
	ks, err := sigOf(c.keyFile)
	if err != nil {
		return fmt.Errorf("tls.key_file: %w", err)
	}
	if c.cert != nil && cs == c.certSig && ks == c.keySig {
		return nil
	}
	pair, err := tls.LoadX509KeyPair(c.certFile, c.keyFile)
	if err != nil {
		return fmt.Errorf("tls: load %s and %s: %w", c.certFile, c.keyFile, err)
	}
	if c.cert != nil {
		c.log.Info("tls certificate reloaded", "cert_file", c.certFile)
	}
	c.cert, c.certSig, c.keySig = &pair, cs, ks
	return nil
}

// GetCertificate is tls.Config.GetCertificate.
func (c *certReloader) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := c.reload(); err != nil {
		c.log.Error("tls certificate reload failed; serving the previous one", "err", err)
	}
	return c.cert, nil
}
