package server

import (
	"fmt"
	"net/url"
	"strconv"
	"sync"

	"github.com/sluice-router/sluice/internal/config"
)

// member is one worker's life in the router outside the scheduler: what
// the proxy needs to reach it (address, credentials, kind, transport)
// and what hangs from its name (a pending drain deadline, its metric
// series). The scheduler's registry is the source of truth for
// membership; a member follows it:
//
//   - added (Server.addWorkerLocked): the member is made and its host's
//     transport installed before the fleet probes it and the scheduler
//     may pick it;
//   - removed (removeWorkerLocked): probes, KV events and the prefix
//     index stop at once; the member stays, leaving, for the streams
//     still running there, which resolve it and which a drain deadline
//     may move;
//   - retired (Server.retire, the scheduler's Config.Retired, after the
//     last of those streams): the member goes, and with it its host's
//     transport, its drain deadline and its metric series;
//   - added again while leaving: the scheduler goes on in the same life,
//     so the new member takes over the name and the series; what the old
//     one held that the new one does not share (another host's
//     transport, its drain deadline) goes at once.
type member struct {
	cfg     config.Worker
	url     *url.URL
	key     string         // the worker's own API key; "" for none
	hostKey string         // scheme://host of url: its transport's key
	host    *hostTransport // its host's transport; nil with a base transport not Sluice's

	// Guarded by members.mu.
	leaving bool   // removed; Sluice's streams may still run on it
	drain   func() // cancels its pending drain deadline; nil for none
}

// members are the router's workers by name, leaving ones included. A
// reader holds mu for reading; Server.retire takes it for writing while
// it deletes the series of a retired worker, so a result observed under
// the read lock either sees the worker and its series are deleted after,
// or does not see it and adds none.
type members struct {
	mu  sync.RWMutex
	all map[string]*member
}

func (ms *members) get(name string) *member {
	ms.mu.RLock()
	defer ms.mu.RUnlock()
	return ms.all[name]
}

// liveLocked reports whether name is a member (leaving or not).
func (ms *members) liveLocked(name string) bool {
	_, ok := ms.all[name]
	return ok
}

// newMember checks what a worker needs before it is probed or scheduled —
// its settings, its API key, its TLS files — and makes its member.
func (s *Server) newMember(w config.Worker) (*member, error) {
	if ps := w.Validate("worker " + strconv.Quote(w.Name)); len(ps) > 0 {
		return nil, ps
	}
	u, err := url.Parse(w.URL)
	if err != nil {
		return nil, fmt.Errorf("worker %s: url: %w", w.Name, err)
	}
	key, err := w.ResolveAPIKey()
	if err != nil {
		return nil, fmt.Errorf("worker %s: api key: %w", w.Name, err)
	}
	ht, err := s.transport.forWorker(w)
	if err != nil {
		return nil, err
	}
	return &member{cfg: w, url: u, key: key, hostKey: hostKey(u), host: ht}, nil
}

// join makes m the member of its name and installs its transport,
// returning the member it replaced, if any; that one's transport goes
// unless m shares it, and its drain deadline is the caller's.
func (s *Server) join(m *member) (old *member) {
	s.members.mu.Lock()
	defer s.members.mu.Unlock()
	if s.members.all == nil {
		s.members.all = map[string]*member{}
	}
	old = s.members.all[m.cfg.Name]
	s.members.all[m.cfg.Name] = m
	if m.host != nil {
		s.transport.install(m.hostKey, m.host)
	}
	if old != nil && old.host != nil && old.host != m.host {
		s.dropHostLocked(old)
	}
	return old
}

// leave undoes join for a member that never served: the one it replaced,
// if any, comes back.
func (s *Server) leave(m, old *member) {
	if old != nil {
		s.join(old)
		return
	}
	s.members.mu.Lock()
	defer s.members.mu.Unlock()
	if s.members.all[m.cfg.Name] == m {
		delete(s.members.all, m.cfg.Name)
		if m.host != nil {
			s.dropHostLocked(m)
		}
	}
}

// dropHostLocked takes m's transport out of the router, unless another
// member uses it; when another member on m's host has a transport of its
// own, that one takes the host.
func (s *Server) dropHostLocked(m *member) {
	var next *hostTransport
	for _, o := range s.members.all {
		if o.host == m.host {
			return
		}
		if o.hostKey == m.hostKey && o.host != nil {
			next = o.host
		}
	}
	s.transport.uninstall(m.hostKey, m.host, next)
}

// setLeaving marks name's member as removed (or, undoing a removal the
// scheduler refused, not).
func (s *Server) setLeaving(name string, leaving bool) {
	s.members.mu.Lock()
	defer s.members.mu.Unlock()
	if m := s.members.all[name]; m != nil {
		m.leaving = leaving
	}
}

// retire is the scheduler's Config.Retired: the removed worker's last
// stream ended, and the router forgets it. It runs under the scheduler's
// lock, so it calls nothing that calls the scheduler.
func (s *Server) retire(name string) {
	s.members.mu.Lock()
	m := s.members.all[name]
	if m == nil || !m.leaving {
		// Added again since: the new life keeps the name.
		s.members.mu.Unlock()
		return
	}
	delete(s.members.all, name)
	if m.host != nil {
		s.dropHostLocked(m)
	}
	s.metrics.forget(name)
	s.lora.forget(name)
	s.members.mu.Unlock()
	if stop := s.takeDrain(m); stop != nil {
		stop()
	}
}

// setDrain makes stop name's pending drain deadline, cancelling the one
// before; with no member of the name (retired meanwhile) stop is called
// at once, there being no stream left to move.
func (s *Server) setDrain(name string, stop func()) {
	s.members.mu.Lock()
	m := s.members.all[name]
	var prev func()
	if m != nil {
		prev, m.drain = m.drain, stop
	} else {
		prev = stop
	}
	s.members.mu.Unlock()
	if prev != nil {
		prev()
	}
}

// takeDrain takes m's pending drain deadline off it: its cancel, nil for
// none.
func (s *Server) takeDrain(m *member) func() {
	s.members.mu.Lock()
	defer s.members.mu.Unlock()
	stop := m.drain
	m.drain = nil
	return stop
}

// stopDrains cancels the pending drain deadline of the member name, or of
// every member when name is "" (Close).
func (s *Server) stopDrains(name string) {
	s.members.mu.RLock()
	var ms []*member
	for n, m := range s.members.all {
		if name == "" || n == name {
			ms = append(ms, m)
		}
	}
	s.members.mu.RUnlock()
	for _, m := range ms {
		if stop := s.takeDrain(m); stop != nil {
			stop()
		}
	}
}

// resolve is the proxy's Resolve: the worker's URL while it is a member.
func (s *Server) resolve(worker string) (*url.URL, bool) {
	if m := s.members.get(worker); m != nil {
		return m.url, true
	}
	return nil, false
}

// credentials is the proxy's Credentials hook: what it sends a worker in
// place of the client's Authorization header — the worker's own key, or
// with none, the client's when forward_client_auth is set.
func (s *Server) credentials(worker string) (key string, forwardClientAuth bool) {
	if m := s.members.get(worker); m != nil {
		return m.key, m.cfg.ForwardClientAuth
	}
	return "", false
}

// kindOf is the proxy's KindOf: a worker's engine kind.
func (s *Server) kindOf(worker string) string {
	if m := s.members.get(worker); m != nil {
		return m.cfg.Kind
	}
	return ""
}
