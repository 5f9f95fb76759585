package server

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/sluice-router/sluice/internal/config"
)

// workerTransport sends each request with the settings of the worker it
// is for: each worker's host gets a transport of its own, cloned from the
// base one, with the idle-connection timeout of the worker's kind
// (proxy.idle_conn_timeout: shorter than the worker keeps idle connections,
// so Sluice never picks one the worker has closed) and the worker's TLS
// settings. Requests to any other host go through the base transport.
//
// RoundTripFresh sends a request on a connection of its own, never one
// from the pool: the proxy resends there a request whose pooled
// connection turned out to be closed.
type workerTransport struct {
	base http.RoundTripper
	// baseFresh is base without keep-alives; nil when base is not an
	// *http.Transport (a test's), and then RoundTripFresh uses base.
	baseFresh *http.Transport
	// idle gives a worker's kind its idle-connection timeout.
	idle   func(kind string) time.Duration
	byHost sync.Map // scheme://host -> *hostTransport
}

// hostTransport is one worker host's pair of transports.
type hostTransport struct {
	pooled *http.Transport // keeps idle connections, up to the kind's timeout
	fresh  *http.Transport // dials a new connection for every request
}

func newWorkerTransport(base http.RoundTripper, idle func(kind string) time.Duration) *workerTransport {
	t := &workerTransport{base: base, idle: idle}
	if b, ok := base.(*http.Transport); ok {
		t.baseFresh = noKeepAlives(b)
	}
	return t
}

// noKeepAlives returns a copy of tr that never reuses a connection.
func noKeepAlives(tr *http.Transport) *http.Transport {
	f := tr.Clone()
	f.DisableKeepAlives = true
	return f
}

// hostKey is u's scheme and host: the key of its transport.
func hostKey(u *url.URL) string { return u.Scheme + "://" + u.Host }

func (t *workerTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if ht, ok := t.byHost.Load(hostKey(r.URL)); ok {
		return ht.(*hostTransport).pooled.RoundTrip(r)
	}
	return t.base.RoundTrip(r)
}

// RoundTripFresh sends r on a new connection, closed after the answer.
func (t *workerTransport) RoundTripFresh(r *http.Request) (*http.Response, error) {
	if ht, ok := t.byHost.Load(hostKey(r.URL)); ok {
		return ht.(*hostTransport).fresh.RoundTrip(r)
	}
	if t.baseFresh != nil {
		return t.baseFresh.RoundTrip(r)
	}
	return t.base.RoundTrip(r)
}

// CloseIdleConnections closes idle connections of every transport.
func (t *workerTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
	t.byHost.Range(func(_, v any) bool {
		v.(*hostTransport).pooled.CloseIdleConnections()
		return true
	})
}

// forWorker makes w's host a transport of its own: the idle-connection
// timeout of w's kind and w's TLS settings; install puts it in use. With a
// base transport that is not an *http.Transport (a test's) it is nil, and
// only TLS settings are refused: the idle timeout is then the base's
// business.
func (t *workerTransport) forWorker(w config.Worker) (*hostTransport, error) {
	tlsSet := w.TLSCAFile != "" || w.TLSInsecureSkipVerify
	base, ok := t.base.(*http.Transport)
	if !ok {
		if tlsSet {
			return nil, fmt.Errorf("worker %s: tls settings need Sluice's own HTTP transport", w.Name)
		}
		return nil, nil
	}
	tr := base.Clone()
	if t.idle != nil {
		tr.IdleConnTimeout = t.idle(w.Kind)
	}
	if tlsSet {
		tc := &tls.Config{MinVersion: tls.VersionTLS12}
		if w.TLSInsecureSkipVerify {
			tc.InsecureSkipVerify = true
		}
		if w.TLSCAFile != "" {
			pem, err := os.ReadFile(w.TLSCAFile)
			if err != nil {
				return nil, fmt.Errorf("worker %s: tls_ca_file: %w", w.Name, err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("worker %s: tls_ca_file %s: no PEM certificate in it", w.Name, w.TLSCAFile)
			}
			tc.RootCAs = pool
		}
		tr.TLSClientConfig = tc
	}
	return &hostTransport{pooled: tr, fresh: noKeepAlives(tr)}, nil
}

// install sends the requests to host (a hostKey) through ht; the idle
// connections of the transport it replaces are closed.
func (t *workerTransport) install(host string, ht *hostTransport) {
	if old, loaded := t.byHost.Swap(host, ht); loaded && old != ht {
		old.(*hostTransport).pooled.CloseIdleConnections()
	}
}

// uninstall takes ht out of use for host, which next (a transport of
// another worker on the host) takes over, or with next nil, the base
// transport; ht's idle connections are closed.
func (t *workerTransport) uninstall(host string, ht, next *hostTransport) {
	if next != nil {
		t.byHost.CompareAndSwap(host, ht, next)
	} else {
		t.byHost.CompareAndDelete(host, ht)
	}
	ht.pooled.CloseIdleConnections()
}
