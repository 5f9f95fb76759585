// Package redisconn turns a redis:// or rediss:// URL from Sluice's
// configuration into a go-redis client, so the stats store and the shared
// ledger parse, validate and dial Redis the same way.
//
// The URL is go-redis's (redis://[user:password@]host:port/db, rediss:// for
// TLS, options such as dial_timeout as query parameters) plus one query
// parameter of Sluice's own, prefix, which starts every key Sluice writes so
// several deployments can share one Redis.
package redisconn

import (
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/redis/go-redis/v9"
)

// DefaultPrefix starts every key when the URL names no prefix.
const DefaultPrefix = "sluice:"

// Default timeouts, used where the URL sets none: short, because every
// caller has a local fallback and a slow Redis must not hold up routing.
const (
	DefaultDialTimeout = time.Second
	DefaultIOTimeout   = 500 * time.Millisecond
)

// IsURL reports whether s names Redis rather than a file.
func IsURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "redis" || u.Scheme == "rediss")
}

// Parse validates raw and returns the client options and the key prefix.
// prefix, when not empty, overrides the URL's prefix parameter.
func Parse(raw, prefix string) (*redis.Options, string, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, "", fmt.Errorf("%q: %v", raw, err)
	}
	if u.Scheme != "redis" && u.Scheme != "rediss" {
		return nil, "", fmt.Errorf("%q: scheme must be redis or rediss", raw)
	}
	if u.Host == "" {
		return nil, "", fmt.Errorf("%q: no host", raw)
	}
	q := u.Query()
	p := DefaultPrefix
	if q.Has("prefix") {
		p = q.Get("prefix")
		q.Del("prefix")
	}
	if prefix != "" {
		p = prefix
	}
	if p == "" {
		return nil, "", errors.New("empty key prefix: keys would collide with other users of the database")
	}
	timeouts := q.Has("read_timeout") || q.Has("write_timeout")
	dial := q.Has("dial_timeout")
	retries := q.Has("max_retries")
	u.RawQuery = q.Encode()
	opts, err := redis.ParseURL(u.String())
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", redact(u), err)
	}
	if !dial {
		opts.DialTimeout = DefaultDialTimeout
	}
	if !retries {
		opts.MaxRetries = 1
	}
	if !timeouts {
		opts.ReadTimeout, opts.WriteTimeout = DefaultIOTimeout, DefaultIOTimeout
	}
	return opts, p, nil
}

// Open parses raw (see Parse) and returns a client; it does not dial, so a
// Redis that is down at start is reported by the first command, not here.
func Open(raw, prefix string) (*redis.Client, string, error) {
	opts, p, err := Parse(raw, prefix)
	if err != nil {
		return nil, "", err
	}
	return redis.NewClient(opts), p, nil
}

// Redact returns raw with any password replaced, for logs and errors.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	return redact(u)
}

func redact(u *url.URL) string {
	if _, ok := u.User.Password(); ok {
		c := *u
		c.User = url.UserPassword(u.User.Username(), "xxxxx")
		return c.String()
	}
	return u.String()
}
