package server

import (
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-router/sluice/internal/auth"
	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/proxy"
)

// routeClass says who may call a route.
type routeClass int

const (
	// routePublic: probes and metrics, open to anyone who reaches the port.
	routePublic routeClass = iota
	// routeClient: the OpenAI-compatible API; needs a client key when
	// keys are configured.
	routeClient
	// routeAdmin: everything else — the admin API, /debug, the dashboard
	// and unknown paths — needs the admin token. Without one configured it
	// answers loopback clients only, and only while the router listens on
	// loopback alone (Server.listenLoopback). Unknown paths are admin so that
	// a route added later is protected until someone decides otherwise.
	routeAdmin
)

func classify(path string) routeClass {
	switch {
	case path == "/healthz", path == "/readyz", path == "/metrics":
		return routePublic
	case path == "/", strings.HasPrefix(path, "/dashboard/"):
		// The dashboard's page and assets hold no data (what it shows
		// comes from /api/overview and /debug, which stay admin). A
		// browser cannot send a bearer token when it navigates; the page
		// takes one from the URL fragment (#token=...) for its calls.
		return routePublic
	case slices.Contains(inferencePaths, path), strings.HasPrefix(path, "/v1/"):
		return routeClient
	}
	return routeAdmin
}

// loadKeys builds the keyring for cfg, keeping the limiter state of
// unchanged keys, and swaps it in.
func (s *Server) loadKeys(cfg config.Auth) error {
	kr, err := auth.Load(cfg, s.keys.Load(), nil)
	if err != nil {
		return fmt.Errorf("auth: %w", err)
	}
	s.keys.Store(kr)
	return nil
}

// loopbackOnly reports whether a listen address takes connections from
// this host alone: a loopback IP, or localhost. An empty host, 0.0.0.0,
// [::] and any other name or address may be reached from the network.
func loopbackOnly(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// logAuthMode says at start who may call what.
func (s *Server) logAuthMode() {
	kr := s.keys.Load()
	if kr.Enabled() {
		s.log.Info("client API keys required on inference routes", "keys", kr.Len())
	} else {
		s.log.Warn("inference routes are open to any client: no auth.keys configured")
	}
	switch {
	case kr.HasAdminToken():
	case s.listenLoopback:
		s.log.Warn("admin routes answer loopback clients only: no auth.admin_token_sha256 or auth.admin_token_file configured")
	default:
		s.log.Warn("admin routes are refused: listen is not a loopback address and no admin token is configured; set auth.admin_token_sha256 or auth.admin_token_file",
			"listen", s.cfg.Listen)
	}
}

// guard authenticates and limits every request before the mux sees it.
func (s *Server) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		kr := s.keys.Load()
		switch classify(r.URL.Path) {
		case routePublic:
			next.ServeHTTP(w, r)
		case routeClient:
			if !kr.Enabled() {
				next.ServeHTTP(w, r)
				return
			}
			key, err := kr.Check(auth.ClientKey(r))
			if err != nil {
				w.Header().Set("WWW-Authenticate", `Bearer realm="sluice"`)
				s.refuse(w, r, http.StatusUnauthorized, "invalid_api_key", err.Error())
				return
			}
			if ok, wait := key.Limiter.Allow(); !ok {
				w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(max(wait, time.Second).Seconds()))))
				s.refuse(w, r, http.StatusTooManyRequests, "rate_limited",
					fmt.Sprintf("API key of tenant %q is over its rate of %g requests/s", key.Identity.Tenant, key.Limiter.Rate()))
				return
			}
			release, ok := key.Limiter.Acquire()
			if !ok {
				w.Header().Set("Retry-After", "1")
				s.refuse(w, r, http.StatusTooManyRequests, "too_many_concurrent",
					fmt.Sprintf("API key of tenant %q already has %d requests open (its max_concurrent)", key.Identity.Tenant, key.Limiter.MaxConcurrent()))
				return
			}
			defer release()
			// The key is Sluice's, not the worker's: never forward it.
			r.Header.Del("Authorization")
			r.Header.Del("X-Api-Key")
			next.ServeHTTP(w, r.WithContext(auth.WithIdentity(r.Context(), key.Identity)))
		case routeAdmin:
			if kr.HasAdminToken() {
				if !kr.CheckAdmin(auth.Bearer(r)) {
					w.Header().Set("WWW-Authenticate", `Bearer realm="sluice-admin"`)
					proxy.WriteError(w, http.StatusUnauthorized, "invalid_admin_token", "admin routes need Authorization: Bearer <admin token>")
					return
				}
			} else if !s.listenLoopback {
				proxy.WriteError(w, http.StatusForbidden, "admin_token_required",
					fmt.Sprintf("admin routes need an admin token when Sluice listens on %s, an address beyond loopback: set auth.admin_token_sha256 or auth.admin_token_file", s.cfg.Listen))
				return
			} else if !auth.IsLoopback(r.RemoteAddr) {
				proxy.WriteError(w, http.StatusForbidden, "admin_loopback_only",
					"admin routes answer loopback clients only until auth.admin_token_sha256 or auth.admin_token_file is set")
				return
			}
			next.ServeHTTP(w, r)
		}
	})
}

// refuse answers an inference request the guard turns away, and counts
// it in sluice_requests_total like the proxy's own refusals (no worker, no
// model: the request was never read).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, status int, reason, msg string) {
	proxy.WriteErrorFor(w, r.URL.Path, status, reason, msg)
	s.metrics.observe(proxy.Result{Status: status, Reason: reason}, nil)
}
