package redisconn

import (
	"strings"
	"testing"
	"time"
)

func TestParse_PrefixTLSAndTimeouts(t *testing.T) {
	tests := []struct {
		name, url, prefix string
		wantPrefix        string
		wantTLS           bool
		wantRead          time.Duration
		wantDB            int
	}{
		{"defaults", "redis://127.0.0.1:6379/0", "", DefaultPrefix, false, DefaultIOTimeout, 0},
		{"url prefix", "redis://h:6379/4?prefix=prod:", "", "prod:", false, DefaultIOTimeout, 4},
		{"config prefix wins", "redis://h:6379/0?prefix=prod:", "staging:", "staging:", false, DefaultIOTimeout, 0},
		{"tls and password", "rediss://:pw@h:6380/1?read_timeout=2s", "", DefaultPrefix, true, 2 * time.Second, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o, p, err := Parse(tt.url, tt.prefix)
			if err != nil {
				t.Fatal(err)
			}
			if p != tt.wantPrefix || (o.TLSConfig != nil) != tt.wantTLS || o.ReadTimeout != tt.wantRead || o.DB != tt.wantDB {
				t.Fatalf("prefix %q tls %v read timeout %v db %d; want %q %v %v %d",
					p, o.TLSConfig != nil, o.ReadTimeout, o.DB, tt.wantPrefix, tt.wantTLS, tt.wantRead, tt.wantDB)
			}
		})
	}
}

func TestParse_RejectsAndRedacts(t *testing.T) {
	for _, tt := range []struct{ url, want string }{
		{"http://h:1", "scheme must be redis or rediss"},
		{"redis://:s3cret@h:1/0?bogus=1", "unexpected option: bogus"},
		{"redis://h:1/0?prefix=", "empty key prefix"},
	} {
		_, _, err := Parse(tt.url, "")
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("Parse(%q) = %v, want an error mentioning %q", tt.url, err, tt.want)
		}
		if err != nil && strings.Contains(err.Error(), "s3cret") {
			t.Errorf("error %q leaks the password", err)
		}
	}
}
