package auth

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/sluice-router/sluice/internal/config"
)

func hexOf(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

func TestKeyring_CheckFindsTheKeyAndItsIdentity(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "k2")
	if err := os.WriteFile(file, []byte("  secret-two\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	kr, err := Load(config.Auth{Keys: []config.APIKey{
		{KeySHA256: hexOf("secret-one"), Tenant: "acme", Class: "interactive"},
		{KeyFile: file, Tenant: "beta", Class: "batch"},
	}}, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		token string
		want  Identity
		err   error
	}{
		{"secret-one", Identity{Tenant: "acme", Class: "interactive"}, nil},
		{"secret-two", Identity{Tenant: "beta", Class: "batch"}, nil},
		{"secret-on", Identity{}, ErrInvalidKey},
		{"secret-one ", Identity{}, ErrInvalidKey},
		{"", Identity{}, ErrMissingKey},
	} {
		key, err := kr.Check(tc.token)
		if err != tc.err {
			t.Errorf("Check(%q) error = %v, want %v", tc.token, err, tc.err)
			continue
		}
		if err == nil {
			if diff := cmp.Diff(tc.want, key.Identity); diff != "" {
				t.Errorf("Check(%q) identity (-want +got):\n%s", tc.token, diff)
			}
		}
	}
	if !kr.Enabled() || kr.HasAdminToken() {
		t.Fatalf("Enabled, HasAdminToken = %v, %v; want true, false", kr.Enabled(), kr.HasAdminToken())
	}
}

func TestKeyring_AdminToken(t *testing.T) {
	file := filepath.Join(t.TempDir(), "admin")
	os.WriteFile(file, []byte("root-token\n"), 0o600)
	for name, cfg := range map[string]config.Auth{
		"sha256": {AdminTokenSHA256: hexOf("root-token")},
		"file":   {AdminTokenFile: file},
	} {
		kr, err := Load(cfg, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		if !kr.CheckAdmin("root-token") || kr.CheckAdmin("root-toke") || kr.CheckAdmin("") {
			t.Errorf("%s: admin check accepts the wrong tokens", name)
		}
		if kr.Enabled() {
			t.Errorf("%s: an admin token alone turned on client keys", name)
		}
	}
}

func TestLoad_ErrorsNameThePathNeverTheKey(t *testing.T) {
	dir := t.TempDir()
	empty := filepath.Join(dir, "empty")
	os.WriteFile(empty, []byte("\n"), 0o600)
	dupFile := filepath.Join(dir, "dup")
	os.WriteFile(dupFile, []byte("secret-one"), 0o600)
	_, err := Load(config.Auth{Keys: []config.APIKey{
		{KeySHA256: hexOf("secret-one"), Tenant: "a"},
		{KeyFile: filepath.Join(dir, "missing"), Tenant: "b"},
		{KeyFile: empty, Tenant: "c"},
		{KeyFile: dupFile, Tenant: "d"},
		{KeySHA256: "abc", Tenant: "e"},
	}}, nil, nil)
	if err == nil {
		t.Fatal("Load accepted broken keys")
	}
	msg := err.Error()
	for _, want := range []string{"auth.keys[1].key_file", "auth.keys[2].key_file", "is empty", "auth.keys[3]: same key as auth.keys[0]", "auth.keys[4].key_sha256"} {
		if !strings.Contains(msg, want) {
			t.Errorf("error %q does not contain %q", msg, want)
		}
	}
	if strings.Contains(msg, "secret-one") || strings.Contains(msg, hexOf("secret-one")) {
		t.Errorf("error %q leaks a key", msg)
	}
}

// fakeClock is a clock a test moves by hand.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time { return c.t }

func TestLimiter_RateRefillsAndSaysWhenToRetry(t *testing.T) {
	c := &fakeClock{t: time.Unix(1000, 0)}
	l := NewLimiter(2, 0, c.now) // 2/s, burst 2
	for i := range 2 {
		if ok, _ := l.Allow(); !ok {
			t.Fatalf("request %d of the burst refused", i)
		}
	}
	ok, wait := l.Allow()
	if ok || wait != 500*time.Millisecond {
		t.Fatalf("third request: ok=%v wait=%v, want refused and 500ms", ok, wait)
	}
	c.t = c.t.Add(500 * time.Millisecond)
	if ok, _ := l.Allow(); !ok {
		t.Fatal("refused after the refill interval")
	}
	c.t = c.t.Add(time.Hour) // a long pause refills only up to the burst
	for i := range 3 {
		ok, _ := l.Allow()
		if want := i < 2; ok != want {
			t.Fatalf("after a pause, request %d ok=%v, want %v", i, ok, want)
		}
	}
}

func TestLimiter_ConcurrencyAndUnlimited(t *testing.T) {
	l := NewLimiter(0, 2, nil)
	r1, ok1 := l.Acquire()
	_, ok2 := l.Acquire()
	_, ok3 := l.Acquire()
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("acquire ok = %v %v %v, want true true false", ok1, ok2, ok3)
	}
	r1()
	r1() // releasing twice frees one slot only
	if got := l.open.Load(); got != 1 {
		t.Fatalf("open = %d after one release, want 1", got)
	}
	if _, ok := l.Acquire(); !ok {
		t.Fatal("slot not freed by release")
	}
	for range 100 {
		if ok, _ := l.Allow(); !ok {
			t.Fatal("rate 0 limited a request")
		}
	}
}

func TestLoad_ReloadKeepsLimiterOfUnchangedKeys(t *testing.T) {
	cfg := config.Auth{Keys: []config.APIKey{
		{KeySHA256: hexOf("a"), Tenant: "a", Rate: 1},
		{KeySHA256: hexOf("b"), Tenant: "b", Rate: 1},
	}}
	old, err := Load(cfg, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Keys[1].Rate = 5
	next, err := Load(cfg, old, nil)
	if err != nil {
		t.Fatal(err)
	}
	a0, _ := old.Check("a")
	a1, _ := next.Check("a")
	b0, _ := old.Check("b")
	b1, _ := next.Check("b")
	if a0.Limiter != a1.Limiter {
		t.Error("unchanged key lost its limiter state on reload")
	}
	if b0.Limiter == b1.Limiter || b1.Limiter.Rate() != 5 {
		t.Error("changed key kept its old limits")
	}
}

func TestIsLoopbackAndBearer(t *testing.T) {
	for addr, want := range map[string]bool{
		"127.0.0.1:5000": true, "[::1]:80": true, "127.9.9.9:1": true, "[::ffff:127.0.0.1]:1": true,
		"10.0.0.1:5000": false, "[2001:db8::1]:443": false, "garbage": false, "": false,
	} {
		if got := IsLoopback(addr); got != want {
			t.Errorf("IsLoopback(%q) = %v, want %v", addr, got, want)
		}
	}
	for hdr, want := range map[string]string{
		"Bearer abc": "abc", "bearer  abc ": "abc", "Basic abc": "", "Bearer": "", "": "",
	} {
		r := httptest.NewRequest("GET", "/", nil)
		if hdr != "" {
			r.Header.Set("Authorization", hdr)
		}
		if got := Bearer(r); got != want {
			t.Errorf("Bearer(%q) = %q, want %q", hdr, got, want)
		}
	}
}
