package config

import (
	"strings"
	"testing"
	"time"
)

func TestValidate_HardeningKeysNameTheirPath(t *testing.T) {
	good := strings.Repeat("ab", 32)
	for _, tc := range []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"key without secret", func(c *Config) { c.Auth.Keys = []APIKey{{Tenant: "a"}} }, "auth.keys[0]: set key_sha256 or key_file"},
		{"key with both", func(c *Config) { c.Auth.Keys = []APIKey{{Tenant: "a", KeySHA256: good, KeyFile: "f"}} }, "not both"},
		{"short hash", func(c *Config) { c.Auth.Keys = []APIKey{{Tenant: "a", KeySHA256: "abc"}} }, "auth.keys[0].key_sha256: want 64 hex digits"},
		{"no tenant", func(c *Config) { c.Auth.Keys = []APIKey{{KeySHA256: good}} }, "auth.keys[0].tenant: missing"},
		{"duplicate", func(c *Config) {
			c.Auth.Keys = []APIKey{{KeySHA256: good, Tenant: "a"}, {KeySHA256: strings.ToUpper(good), Tenant: "b"}}
		}, "auth.keys[1].key_sha256: same key as auth.keys[0]"},
		{"negative rate", func(c *Config) { c.Auth.Keys = []APIKey{{KeySHA256: good, Tenant: "a", Rate: -1}} }, "auth.keys[0].rate"},
		{"negative concurrency", func(c *Config) { c.Auth.Keys = []APIKey{{KeySHA256: good, Tenant: "a", MaxConcurrent: -1}} }, "auth.keys[0].max_concurrent"},
		{"admin both", func(c *Config) { c.Auth.AdminTokenSHA256, c.Auth.AdminTokenFile = good, "f" }, "auth: set admin_token_sha256 or admin_token_file"},
		{"admin hash", func(c *Config) { c.Auth.AdminTokenSHA256 = "zz" }, "auth.admin_token_sha256"},
		{"header bytes", func(c *Config) { c.Server.MaxHeaderBytes = 10 }, "server.max_header_bytes"},
		{"read header timeout", func(c *Config) { c.Server.ReadHeaderTimeout = 0 }, "server.read_header_timeout"},
		{"idle timeout", func(c *Config) { c.Server.IdleTimeout = -time.Second }, "server.idle_timeout"},
		{"connections", func(c *Config) { c.Server.MaxConnections = -1 }, "server.max_connections"},
		{"drain delay", func(c *Config) { c.Shutdown.DrainDelay = -time.Second }, "shutdown.drain_delay"},
		{"grace", func(c *Config) { c.Shutdown.Grace = 0 }, "shutdown.grace"},
		{"tls half", func(c *Config) { c.TLS.CertFile = "c.pem" }, "tls: set both"},
		{"worker tls on http", func(c *Config) { c.Workers[0].TLSCAFile = "ca.pem" }, "workers[0].tls_ca_file: TLS settings need an https url"},
		{"worker ca and skip", func(c *Config) {
			c.Workers[0].URL = "https://w:1"
			c.Workers[0].TLSCAFile, c.Workers[0].TLSInsecureSkipVerify = "ca.pem", true
		}, "workers[0].tls_insecure_skip_verify"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			c.Workers = []Worker{{Name: "w", URL: "http://w:1", Kind: "openai"}}
			if err := c.Validate(); err != nil {
				t.Fatalf("base config invalid: %v", err)
			}
			tc.edit(&c)
			err := c.Validate()
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

func TestParse_AuthSectionFromYAML(t *testing.T) {
	good := strings.Repeat("0f", 32)
	cfg, err := parse(`
workers: [{name: w, url: "http://w:1"}]
auth:
  keys:
    - {key_sha256: "` + good + `", tenant: acme, class: interactive, rate: 5, max_concurrent: 2}
  admin_token_file: /run/secrets/admin
server: {max_connections: 100, read_header_timeout: 3s}
shutdown: {drain_delay: 1s, grace: 10s}
`)
	if err != nil {
		t.Fatal(err)
	}
	k := cfg.Auth.Keys[0]
	if k.Tenant != "acme" || k.Class != "interactive" || k.Rate != 5 || k.MaxConcurrent != 2 || cfg.Auth.AdminTokenFile == "" {
		t.Fatalf("auth decoded as %+v", cfg.Auth)
	}
	if cfg.Server.MaxConnections != 100 || cfg.Server.ReadHeaderTimeout != 3*time.Second || cfg.Server.IdleTimeout != 2*time.Minute {
		t.Fatalf("server decoded as %+v", cfg.Server)
	}
	if cfg.Shutdown.DrainDelay != time.Second || cfg.Shutdown.Grace != 10*time.Second {
		t.Fatalf("shutdown decoded as %+v", cfg.Shutdown)
	}
}
