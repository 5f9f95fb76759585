package auth

import (
	"net/http/httptest"
	"testing"

	"github.com/sluice-router/sluice/internal/config"
)

// FuzzCheck presents arbitrary Authorization headers: only the exact key
// is accepted, and nothing panics.
func FuzzCheck(f *testing.F) {
	const key = "sk-fuzz-key"
	kr, err := Load(config.Auth{Keys: []config.APIKey{{KeySHA256: hexOf(key), Tenant: "t"}}, AdminTokenSHA256: hexOf("adm")}, nil, nil)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"Bearer " + key, "bearer " + key + " ", "Bearer", "Basic x", "Bearer \x00", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, hdr string) {
		r := httptest.NewRequest("GET", "/", nil)
		r.Header["Authorization"] = []string{hdr}
		tok := Bearer(r)
		k, err := kr.Check(tok)
		if (err == nil) != (tok == key) {
			t.Fatalf("header %q: token %q accepted=%v", hdr, tok, err == nil)
		}
		if err == nil && k.Identity.Tenant != "t" {
			t.Fatalf("wrong identity %+v", k.Identity)
		}
		if kr.CheckAdmin(tok) != (tok == "adm") {
			t.Fatalf("admin check wrong for %q", tok)
		}
		IsLoopback(hdr)
	})
}
