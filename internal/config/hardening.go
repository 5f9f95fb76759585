package config

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// validateHardening checks the auth, server, shutdown and TLS sections,
// each problem with its key path.
func (c *Config) validateHardening(bad report) {
	seen := map[string]int{}
	for i, k := range c.Auth.Keys {
		key := fmt.Sprintf("auth.keys[%d]", i)
		switch {
		case k.KeySHA256 == "" && k.KeyFile == "":
			bad(key, "set key_sha256 or key_file")
		case k.KeySHA256 != "" && k.KeyFile != "":
			bad(key, "set key_sha256 or key_file, not both")
		case k.KeySHA256 != "":
			if err := checkSHA256(k.KeySHA256); err != nil {
				bad(key+".key_sha256", "%v", err)
			} else if j, dup := seen[strings.ToLower(k.KeySHA256)]; dup {
				bad(key+".key_sha256", "same key as auth.keys[%d]", j)
			} else {
				seen[strings.ToLower(k.KeySHA256)] = i
			}
		}
		if strings.TrimSpace(k.Tenant) == "" {
			bad(key+".tenant", "missing: every key belongs to a tenant")
		} else if strings.ContainsAny(k.Tenant, " \t\n\"") {
			bad(key+".tenant", "%q must not contain spaces or quotes", k.Tenant)
		}
		if strings.ContainsAny(k.Class, " \t\n\"") {
			bad(key+".class", "%q must not contain spaces or quotes", k.Class)
		}
		if k.Rate < 0 {
			bad(key+".rate", "negative (%v); 0 is unlimited", k.Rate)
		}
		if k.MaxConcurrent < 0 {
			bad(key+".max_concurrent", "negative (%d); 0 is unlimited", k.MaxConcurrent)
		}
	}
	if c.Auth.AdminTokenSHA256 != "" && c.Auth.AdminTokenFile != "" {
		bad("auth", "set admin_token_sha256 or admin_token_file, not both")
	}
	if c.Auth.AdminTokenSHA256 != "" {
		if err := checkSHA256(c.Auth.AdminTokenSHA256); err != nil {
			bad("auth.admin_token_sha256", "%v", err)
		}
	}
	sv := c.Server
	if sv.MaxHeaderBytes < 1024 {
		bad("server.max_header_bytes", "must be at least 1024, got %d", sv.MaxHeaderBytes)
	}
	if sv.ReadHeaderTimeout <= 0 {
		bad("server.read_header_timeout", "must be positive, got %v (it is the slow-client guard)", sv.ReadHeaderTimeout)
	}
	positive(bad, "server.idle_timeout", sv.IdleTimeout)
	if sv.MaxConnections < 0 {
		bad("server.max_connections", "negative (%d); 0 sizes it to the open-file limit", sv.MaxConnections)
	}
	if c.Shutdown.DrainDelay < 0 {
		bad("shutdown.drain_delay", "negative (%v)", c.Shutdown.DrainDelay)
	}
	positive(bad, "shutdown.grace", c.Shutdown.Grace)
	if (c.TLS.CertFile == "") != (c.TLS.KeyFile == "") {
		bad("tls", "set both cert_file and key_file, or neither")
	}
}

func checkSHA256(s string) error {
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != 32 {
		return fmt.Errorf("want 64 hex digits (sha256sum of the key), got %d characters", len(s))
	}
	return nil
}
