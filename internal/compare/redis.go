package compare

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// privateRedis is a redis-server that `sluice bench compare --replicas`
// started for itself, on a free loopback port, keeping nothing on disk.
type privateRedis struct {
	addr string
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

// errNoRedis says how to give --replicas a Redis.
var errNoRedis = errors.New("--replicas needs a Redis the replicas share: give --redis redis://host:port/db, or put redis-server on PATH (e.g. apt-get install redis-server) and one is started for the run")

// startPrivateRedis starts redis-server from PATH and waits until it
// answers; errNoRedis when there is none.
func startPrivateRedis(ctx context.Context) (*privateRedis, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, errNoRedis
	}
	dir, err := os.MkdirTemp("", "sluice-bench-redis-")
	if err != nil {
		return nil, fmt.Errorf("private redis-server: %w", err)
	}
	var last error
	for range 5 { // a free port can be taken between probe and bind
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("private redis-server: free port: %w", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		r := &privateRedis{addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), dir: dir, done: make(chan struct{})}
		r.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", dir,
			"--save", "", "--appendonly", "no", "--daemonize", "no", "--loglevel", "warning", "--protected-mode", "no")
		if err := r.cmd.Start(); err != nil {
			os.RemoveAll(dir)
			return nil, fmt.Errorf("private redis-server: exec %s: %w", bin, err)
		}
		go func() { _ = r.cmd.Wait(); close(r.done) }()
		if last = r.waitReady(ctx); last == nil {
			return r, nil
		}
		r.stopProcess()
	}
	os.RemoveAll(dir)
	return nil, fmt.Errorf("private redis-server: %w", last)
}

// waitReady polls PING until the server answers, it exits, or 10 s pass.
func (r *privateRedis) waitReady(ctx context.Context) error {
	rdb := redis.NewClient(&redis.Options{Addr: r.addr, MaxRetries: -1})
	defer rdb.Close()
	deadline := time.NewTimer(10 * time.Second)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		err := rdb.Ping(pctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		select {
		case <-r.done:
			return fmt.Errorf("redis-server exited on start (port %s taken?)", r.addr)
		case <-deadline.C:
			return fmt.Errorf("redis-server did not answer on %s within 10s: %v", r.addr, err)
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C: // poll for readiness, bounded by deadline
		}
	}
}

// URL is the server's redis:// URL, database 0.
func (r *privateRedis) URL() string { return "redis://" + r.addr + "/0" }

// Stop ends the server and removes its directory.
func (r *privateRedis) Stop() {
	r.stopProcess()
	os.RemoveAll(r.dir)
}

func (r *privateRedis) stopProcess() {
	_ = r.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		_ = r.cmd.Process.Kill()
		<-r.done
	}
}
