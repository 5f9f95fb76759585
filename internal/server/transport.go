package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sync"

	"github.com/sluice-router/sluice/internal/config"
)

// workerTransport sends each request with the TLS settings of the worker
// it is for: workers with tls_ca_file or tls_insecure_skip_verify get a
// transport of their own, cloned from the base one; every other request
// goes through the base transport.
type workerTransport struct {
	base   http.RoundTripper
	byHost sync.Map // scheme://host -> *http.Transport
}

func (t *workerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if rt, ok := t.byHost.Load(r.URL.Scheme + "://" + r.URL.Host); ok {
		return rt.(*http.Transport).RoundTrip(r)
	}
	return t.base.RoundTrip(r)
}

// CloseIdleConnections closes idle connections of every transport.
func (t *workerTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	t.byHost.Range(func(_, v any) bool {
		v.(*http.Transport).CloseIdleConnections()
		return true
	})
}

// register gives w's host its own TLS settings, if it has any.
func (t *workerTransport) register(w config.Worker, u *url.URL) error {
	if w.TLSCAFile == "" && !w.TLSInsecureSkipVerify {
		return nil
	}
	base, ok := t.base.(*http.Transport)
	if !ok {
		return fmt.Errorf("worker %s: tls settings need Sluice's own HTTP transport", w.Name)
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if w.TLSInsecureSkipVerify {
		tc.InsecureSkipVerify = true
	}
	if w.TLSCAFile != "" {
		pem, err := os.ReadFile(w.TLSCAFile)
		if err != nil {
			return fmt.Errorf("worker %s: tls_ca_file: %w", w.Name, err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("worker %s: tls_ca_file %s: no PEM certificate in it", w.Name, w.TLSCAFile)
		}
		tc.RootCAs = pool
	}
	tr := base.Clone()
	tr.TLSClientConfig = tc
	if old, loaded := t.byHost.Swap(u.Scheme+"://"+u.Host, tr); loaded {
		old.(*http.Transport).CloseIdleConnections()
	}
	return nil
}
