// Package upstream is the one way the router talks to workers. Every connection to a worker —
// routed requests and response lookups (Pools: keep-alive connections the caller holds call by
// call, pool.go and call.go), health probes and probe requests, engine-metric scrapes, LoRA
// adapter fan-out and /tokenize (Dialer.Client) — is dialled by a Dialer: TCP bounded by
// Timeouts.Dial and refused after name resolution when the address is outside
// --worker-url-allow, TLS for https:// workers with the CAs and client certificate configured,
// and the worker's credentials on every request, one way (see Dialer.Authorization). The
// timeouts of all of those calls are one Timeouts value, built from the configuration in one
// place (config.Config.UpstreamTimeouts) and documented in one table in docs/configuration.md.
//
// The routed path's rule of retries lives here too, since only the connection knows what a
// failed call did on the wire: a Failure is Retryable when provably nothing reached a worker or
// nothing of its answer was generated (failure.go), and a pooled connection the worker had closed
// is replaced by a new one at once (Pool.Send). Which worker to try next, and whether to, is the
// caller's.
package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// Dialer connects to workers. The zero value dials any address with no timeout of its own (the
// caller's context bounds it), trusts the system roots and sends no credentials. A Dialer is a
// plain value: copies dial alike.
type Dialer struct {
	// Timeouts bound the calls to workers; Dial and KeepAlive apply to every connection.
	Timeouts Timeouts
	// TLS is the client configuration for https:// workers (trusted CAs, client certificate);
	// each worker's connections use a copy with ServerName set to the worker's host. Nil: the
	// system roots, no client certificate, TLS 1.2 or later.
	TLS *tls.Config
	// Allowed limits the addresses dialled (--worker-url-allow), checked on the address a name
	// resolved to, just before the connection is made; the zero value allows any.
	Allowed tenant.Allowed
	// APIKey (--api-key) is the workers' key, sent as a bearer token on every call (see
	// Authorization).
	APIKey string
}

// Authorization is the Authorization header value every call to the worker at workerURL carries,
// or "" for none: "Bearer <APIKey>" when an API key is configured, else the URL's own
// user:password@ as Basic credentials, else none. One rule for health probes, /v1/models,
// probe requests, scrapes, LoRA fan-out, /tokenize and routed requests (which send the client's
// own Authorization or x-api-key instead when it is forwarded).
func (d Dialer) Authorization(workerURL string) string {
	if d.APIKey != "" {
		return "Bearer " + d.APIKey
	}
	if !strings.Contains(workerURL, "@") {
		return ""
	}
	u, err := url.Parse(workerURL)
	if err != nil {
		return ""
	}
	return basic(u.User)
}

func basic(user *url.Userinfo) string {
	if user == nil {
		return ""
	}
	pass, _ := user.Password()
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(user.Username()+":"+pass))
}

// Target is what connecting to one worker URL takes, worked out once per worker.
type Target struct {
	Addr string // host:port, with the scheme's port when the URL names none
	Host string // the URL's host[:port], for the Host header
	// TLS is the configuration of this worker's connections; nil for http:// workers.
	TLS *tls.Config
	// Authorization is the worker's credential header value; "" for none.
	Authorization string
}

// Target parses workerURL (http(s)://[user:password@]host[:port][/path]).
func (d Dialer) Target(workerURL string) (Target, error) {
	u, err := url.Parse(workerURL)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return Target{}, fmt.Errorf("%q is not an http(s) worker URL", tenant.Redact(workerURL))
	}
	t := Target{Addr: u.Host, Host: u.Host, Authorization: d.Authorization(workerURL)}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
		t.TLS = d.tlsFor(u.Hostname())
	}
	if u.Port() == "" {
		t.Addr = net.JoinHostPort(u.Hostname(), port)
	}
	return t, nil
}

// tlsFor returns the TLS configuration of connections to host: HTTP/1.1, the worker's name.
func (d Dialer) tlsFor(host string) *tls.Config {
	c := d.TLS.Clone() // nil stays nil
	if c == nil {
		c = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	c.ServerName = host
	c.NextProtos = []string{"http/1.1"}
	return c
}

// DialContext opens a TCP connection to addr (host:port) within Timeouts.Dial, refused when the
// address it resolved to is outside Allowed. It is the DialContext of the Transport.
func (d Dialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	nd := net.Dialer{Timeout: d.Timeouts.Dial, KeepAlive: d.Timeouts.KeepAlive, Control: d.Allowed.Control}
	return nd.DialContext(ctx, network, addr)
}

// Dial connects to t: TCP, then for https:// workers the TLS handshake, both within Timeouts.Dial.
// The TCP connection under TLS is the returned *tls.Conn's NetConn.
func (d Dialer) Dial(ctx context.Context, t Target) (net.Conn, error) {
	if d.Timeouts.Dial > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.Timeouts.Dial)
		defer cancel()
	}
	c, err := d.DialContext(ctx, "tcp", t.Addr)
	if err != nil || t.TLS == nil {
		return c, err
	}
	tc := tls.Client(c, t.TLS)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = c.Close()
		return nil, err
	}
	return tc, nil
}

// Client is the net/http client of the router's own calls to workers (probes, /v1/models, probe
// requests, LoRA fan-out, /tokenize): workers are dialled by d, never through a proxy from the
// environment, and every request carries the worker's credential (Authorization). Each request
// is bounded by its caller's context, from Timeouts.
func (d Dialer) Client() *http.Client {
	return &http.Client{Transport: d.Transport()}
}

// Transport is the RoundTripper of Client.
func (d Dialer) Transport() http.RoundTripper {
	tlsConf := d.TLS.Clone()
	if tlsConf == nil {
		tlsConf = &tls.Config{MinVersion: tls.VersionTLS12}
	}
	return &credentials{d: d, base: &http.Transport{
		Proxy:               nil, // workers are reached directly, never through an environment proxy
		DialContext:         d.DialContext,
		TLSClientConfig:     tlsConf,
		TLSHandshakeTimeout: d.Timeouts.Dial,
		MaxIdleConnsPerHost: 4,
		IdleConnTimeout:     d.Timeouts.Idle,
		DisableCompression:  true,
	}}
}

// credentials sets each request's Authorization to the worker's credential. net/http adds a
// URL's user:password@ as Basic credentials itself before the RoundTripper sees the request;
// this replaces that with the Bearer key when one is configured, so that every call to a
// worker carries the same credential.
type credentials struct {
	d    Dialer
	base *http.Transport
}

func (c *credentials) RoundTrip(r *http.Request) (*http.Response, error) {
	want := c.d.APIKey
	if want != "" {
		want = "Bearer " + want
	} else {
		want = basic(r.URL.User)
	}
	if r.Header.Get("Authorization") != want {
		r = r.Clone(r.Context()) // a RoundTripper does not change its caller's request
		if want == "" {
			r.Header.Del("Authorization")
		} else {
			r.Header.Set("Authorization", want)
		}
	}
	return c.base.RoundTrip(r)
}

// CloseIdleConnections closes the idle connections (http.Client.CloseIdleConnections).
func (c *credentials) CloseIdleConnections() { c.base.CloseIdleConnections() }

// NewTLS is the client configuration for https:// workers: TLS 1.2 or later; roots instead of
// the system roots when set (--worker-ca-file); and, when clientCert is set, the client
// certificate it returns (--worker-client-cert-file, reloaded by its caller), presented to a
// worker that asks for one whatever CAs it names: the worker decides.
func NewTLS(roots *x509.CertPool, clientCert func() *tls.Certificate) *tls.Config {
	c := &tls.Config{MinVersion: tls.VersionTLS12, RootCAs: roots}
	if clientCert != nil {
		c.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			return clientCert(), nil
		}
	}
	return c
}
