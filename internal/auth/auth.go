// Package auth decides who may call a Sluice router: client API keys for
// the inference routes, each belonging to a tenant and a priority class
// and optionally limited in rate and concurrency, and one admin token for
// the admin routes.
//
// Keys are held only as SHA-256 hashes. A presented token is hashed and
// compared with every configured hash in constant time, so neither the
// time a check takes nor any log line tells an attacker how close a guess
// was. Nothing in this package logs or returns a key or its hash.
//
// # Concurrency Model
//
// A Keyring is immutable once built; a reload builds a new one (keeping
// the limiter state of keys that did not change) and the caller swaps it
// in atomically. Limiters are safe for concurrent use.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluice-router/sluice/internal/config"
	"github.com/sluice-router/sluice/internal/predict"
)

// Identity is who sent a request, as its API key says.
type Identity struct {
	// Tenant is the key's owner.
	Tenant string
	// Class is the key's priority class; empty is the default class.
	Class string
	// SLO is the key's own SLO, over its class's (auth.keys[].slo).
	SLO predict.SLO
	// NoContinue is set for a key whose broken streams must not be
	// continued on another worker (auth.keys[].continue: false).
	NoContinue bool
}

type ctxKey struct{}

// WithIdentity returns ctx carrying id, for the proxy to read.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, ctxKey{}, id)
}

// FromContext returns the identity of the request ctx belongs to, and
// false for an anonymous request (no keys configured).
func FromContext(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(ctxKey{}).(Identity)
	return id, ok
}

// Errors a check returns; each maps to one HTTP answer.
var (
	// ErrMissingKey: keys are configured and the request has none.
	ErrMissingKey = errors.New("missing API key: send Authorization: Bearer <key>")
	// ErrInvalidKey: the request's key matches no configured key.
	ErrInvalidKey = errors.New("invalid API key")
)

// Key is one client key in a Keyring.
type Key struct {
	hash [sha256.Size]byte
	// Identity is what requests with this key are scheduled as.
	Identity Identity
	// Limiter bounds the key's rate and concurrency.
	Limiter *Limiter
}

// Keyring is the set of client keys and the admin token hash.
type Keyring struct {
	keys  []*Key
	admin *[sha256.Size]byte
}

// Load builds a Keyring from cfg, reading key files. prev, when not nil,
// lends its limiters to keys whose hash and limits did not change, so a
// reload does not reset a key's rate or forget its open requests.
// Errors name the key path; they never contain a key.
func Load(cfg config.Auth, prev *Keyring, now func() time.Time) (*Keyring, error) {
	if now == nil {
		now = time.Now
	}
	k := &Keyring{}
	var errs []error
	seen := map[[sha256.Size]byte]int{}
	for i, kc := range cfg.Keys {
		path := fmt.Sprintf("auth.keys[%d]", i)
		h, err := hashOf(kc.KeySHA256, kc.KeyFile, path+".key_sha256", path+".key_file")
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if j, dup := seen[h]; dup {
			errs = append(errs, fmt.Errorf("%s: same key as auth.keys[%d]", path, j))
			continue
		}
		seen[h] = i
		key := &Key{hash: h, Identity: Identity{Tenant: kc.Tenant, Class: kc.Class, SLO: kc.SLO, NoContinue: kc.Continue != nil && !*kc.Continue}}
		if old := prev.find(h); old != nil && old.Limiter.same(kc.Rate, kc.MaxConcurrent) {
			key.Limiter = old.Limiter
		} else {
			key.Limiter = NewLimiter(kc.Rate, kc.MaxConcurrent, now)
		}
		k.keys = append(k.keys, key)
	}
	if cfg.AdminTokenSHA256 != "" || cfg.AdminTokenFile != "" {
		h, err := hashOf(cfg.AdminTokenSHA256, cfg.AdminTokenFile, "auth.admin_token_sha256", "auth.admin_token_file")
		if err != nil {
			errs = append(errs, err)
		} else {
			k.admin = &h
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return k, nil
}

// hashOf returns the hash a key config names: hexHash decoded, or the
// SHA-256 of file's trimmed contents. Errors name the key path (hexKey or
// fileKey) and the file, never what it holds.
func hashOf(hexHash, file, hexKey, fileKey string) ([sha256.Size]byte, error) {
	var h [sha256.Size]byte
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return h, fmt.Errorf("%s: %w", fileKey, err)
		}
		secret := strings.TrimSpace(string(b))
		if secret == "" {
			return h, fmt.Errorf("%s: %s is empty", fileKey, file)
		}
		return sha256.Sum256([]byte(secret)), nil
	}
	b, err := hex.DecodeString(strings.TrimSpace(hexHash))
	if err != nil || len(b) != sha256.Size {
		return h, fmt.Errorf("%s: want 64 hex digits", hexKey)
	}
	copy(h[:], b)
	return h, nil
}

func (k *Keyring) find(h [sha256.Size]byte) *Key {
	if k == nil {
		return nil
	}
	for _, key := range k.keys {
		if key.hash == h {
			return key
		}
	}
	return nil
}

// Enabled reports whether client keys are configured; without them the
// inference routes are open.
func (k *Keyring) Enabled() bool { return k.Len() > 0 }

// HasAdminToken reports whether an admin token is configured.
func (k *Keyring) HasAdminToken() bool { return k != nil && k.admin != nil }

// Len is the number of client keys.
func (k *Keyring) Len() int {
	if k == nil {
		return 0
	}
	return len(k.keys)
}

// Check returns the key that token is. It hashes token and compares the
// hash with every key's in constant time, visiting all of them.
func (k *Keyring) Check(token string) (*Key, error) {
	if token == "" {
		return nil, ErrMissingKey
	}
	h := sha256.Sum256([]byte(token))
	var found *Key
	for _, key := range k.keys {
		if subtle.ConstantTimeCompare(h[:], key.hash[:]) == 1 {
			found = key
		}
	}
	if found == nil {
		return nil, ErrInvalidKey
	}
	return found, nil
}

// CheckAdmin reports whether token is the admin token, in constant time.
func (k *Keyring) CheckAdmin(token string) bool {
	if !k.HasAdminToken() || token == "" {
		return false
	}
	h := sha256.Sum256([]byte(token))
	return subtle.ConstantTimeCompare(h[:], k.admin[:]) == 1
}

// Bearer returns the token of an "Authorization: Bearer <token>" header,
// or "" when there is none.
func Bearer(r *http.Request) string {
	v := r.Header.Get("Authorization")
	scheme, token, ok := strings.Cut(v, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

// ClientKey returns the API key a client sent: its Authorization bearer
// token, else its x-api-key header, which is how Anthropic's SDKs and
// Claude Code send theirs. "" when neither is set.
func ClientKey(r *http.Request) string {
	if k := Bearer(r); k != "" {
		return k
	}
	return strings.TrimSpace(r.Header.Get("X-Api-Key"))
}

// IsLoopback reports whether a connection's remote address (as in
// http.Request.RemoteAddr) is a loopback address. Forwarding headers are
// not consulted: they are whatever the client wrote.
func IsLoopback(remoteAddr string) bool {
	host, _, err := net.SplitHostPort(remoteAddr)
	if err != nil {
		host = remoteAddr
	}
	a, err := netip.ParseAddr(host)
	return err == nil && a.Unmap().IsLoopback()
}

// Limiter bounds one key's request rate (a token bucket refilled at Rate
// per second, holding up to max(1, Rate)) and its open requests.
type Limiter struct {
	rate    float64
	maxOpen int
	now     func() time.Time

	mu     sync.Mutex
	tokens float64
	last   time.Time

	open atomic.Int64
}

// NewLimiter returns a Limiter; rate 0 and maxOpen 0 are unlimited.
func NewLimiter(rate float64, maxOpen int, now func() time.Time) *Limiter {
	if now == nil {
		now = time.Now
	}
	return &Limiter{rate: rate, maxOpen: maxOpen, now: now, tokens: burst(rate), last: now()}
}

func burst(rate float64) float64 { return math.Max(1, rate) }

func (l *Limiter) same(rate float64, maxOpen int) bool { return l.rate == rate && l.maxOpen == maxOpen }

// Allow takes one token. When none is left it returns false and how long
// until one will be.
func (l *Limiter) Allow() (bool, time.Duration) {
	if l.rate <= 0 {
		return true, 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.now()
	if el := now.Sub(l.last).Seconds(); el > 0 {
		l.tokens = math.Min(burst(l.rate), l.tokens+el*l.rate)
	}
	l.last = now
	if l.tokens >= 1 {
		l.tokens--
		return true, 0
	}
	wait := time.Duration((1 - l.tokens) / l.rate * float64(time.Second))
	return false, wait
}

// Acquire takes one open-request slot; release gives it back. It fails
// when the key already has MaxConcurrent requests open.
func (l *Limiter) Acquire() (release func(), ok bool) {
	n := l.open.Add(1)
	if l.maxOpen > 0 && n > int64(l.maxOpen) {
		l.open.Add(-1)
		return nil, false
	}
	return sync.OnceFunc(func() { l.open.Add(-1) }), true
}

// MaxConcurrent is the key's concurrency bound; 0 is unlimited.
func (l *Limiter) MaxConcurrent() int { return l.maxOpen }

// Rate is the key's rate bound in requests per second; 0 is unlimited.
func (l *Limiter) Rate() float64 { return l.rate }
