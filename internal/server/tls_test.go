package server

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/sluice-router/sluice/internal/config"
)

// testCA is a throwaway certificate authority for loopback TLS tests.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "sluice test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a loopback server certificate with serial to certFile and
// its key to keyFile.
func (ca *testCA) issue(t *testing.T, serial int64, certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (ca *testCA) client() *http.Client {
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(ca.pem)
	return &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, DisableKeepAlives: true}}
}

func TestServe_TLSListenerReloadsRenewedCertificate(t *testing.T) {
	ca := newTestCA(t)
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	ca.issue(t, 100, certFile, keyFile)
	s := serveRouter(t, testConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		quickShutdown(c)
		c.TLS = config.TLS{CertFile: certFile, KeyFile: keyFile}
	}), nil)
	client := ca.client()
	serial := func() int64 {
		t.Helper()
		resp, err := client.Get(s.url + "/healthz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return resp.TLS.PeerCertificates[0].SerialNumber.Int64()
	}
	if got := serial(); got != 100 {
		t.Fatalf("serial %d, want 100", got)
	}
	// Plain HTTP on the TLS port is refused.
	if resp, err := http.Get("http://" + s.addr + "/healthz"); err == nil && resp.StatusCode == 200 {
		t.Fatal("plain HTTP served on the TLS listener")
	}
	// Renewal: new files (with a later mtime, as a renewal has).
	ca.issue(t, 101, certFile, keyFile)
	later := time.Now().Add(time.Minute)
	os.Chtimes(certFile, later, later)
	os.Chtimes(keyFile, later, later)
	if got := serial(); got != 101 {
		t.Fatalf("after renewal serial %d, want 101", got)
	}
	// A broken renewal keeps the previous certificate.
	os.WriteFile(certFile, []byte("not a certificate"), 0o600)
	later = later.Add(time.Minute)
	os.Chtimes(certFile, later, later)
	if got := serial(); got != 101 {
		t.Fatalf("after a broken renewal serial %d, want the previous 101", got)
	}
}

func TestServe_TLSBadFilesFailAtStart(t *testing.T) {
	cfg := testConfig(t, []*fakeWorker{newFakeWorker(t, "w1")}, func(c *config.Config) {
		quickShutdown(c)
		c.TLS = config.TLS{CertFile: filepath.Join(t.TempDir(), "missing.pem"), KeyFile: filepath.Join(t.TempDir(), "k.pem")}
	})
	srv, err := New(cfg, Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	err = srv.Serve(t.Context(), ln, 0)
	if err == nil || !strings.Contains(err.Error(), "tls.cert_file") {
		t.Fatalf("Serve with a missing certificate: %v", err)
	}
}

func TestRouter_WorkerTLSVerifiesWithItsCAFile(t *testing.T) {
	w := newFakeWorker(t, "w1")
	w.srv.Close()
	w.srv = httptest.NewTLSServer(http.HandlerFunc(w.serve))
	t.Cleanup(w.srv.Close)
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	os.WriteFile(caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: w.srv.Certificate().Raw}), 0o600)
	for _, tc := range []struct {
		name   string
		edit   func(*config.Worker)
		status int
	}{
		{"system roots do not know the worker", func(*config.Worker) {}, http.StatusBadGateway},
		{"tls_ca_file", func(cw *config.Worker) { cw.TLSCAFile = caFile }, http.StatusOK},
		{"tls_insecure_skip_verify", func(cw *config.Worker) { cw.TLSInsecureSkipVerify = true }, http.StatusOK},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := startRouter(t, testConfig(t, []*fakeWorker{w}, func(c *config.Config) {
				c.Proxy.MaxAttempts = 1
				tc.edit(&c.Workers[0])
			}))
			resp := post(t, t.Context(), r.url, chat("tls", false))
			body := readAll(t, resp)
			if resp.StatusCode != tc.status {
				t.Fatalf("status %d, want %d: %s", resp.StatusCode, tc.status, body)
			}
		})
	}
	bad := filepath.Join(t.TempDir(), "bad.pem")
	os.WriteFile(bad, []byte("garbage"), 0o600)
	cfg := testConfig(t, []*fakeWorker{w}, func(c *config.Config) { c.Workers[0].TLSCAFile = bad })
	if _, err := New(cfg, Options{}); err == nil || !strings.Contains(err.Error(), "tls_ca_file") {
		t.Fatalf("New with a CA file holding no certificate: %v", err)
	}
}
