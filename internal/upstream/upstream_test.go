package upstream

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// recorder is a worker that answers 200 and keeps each request's Authorization by path.
type recorder struct {
	mu   sync.Mutex
	auth map[string]string
}

func (rec *recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rec.mu.Lock()
	rec.auth[r.URL.Path] = r.Header.Get("Authorization")
	rec.mu.Unlock()
	_, _ = io.WriteString(w, "ok")
}

func (rec *recorder) seen(path string) string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return rec.auth[path]
}

// startTLSWorker serves rec over TLS on 127.0.0.1 with a certificate of ca; with clientCAs set
// it requires a client certificate they issued.
func startTLSWorker(t *testing.T, ca *testkit.CA, clientCAs *x509.CertPool) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(&recorder{auth: map[string]string{}})
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, 2, false).TLS()}}
	if clientCAs != nil {
		srv.TLS.ClientAuth, srv.TLS.ClientCAs = tls.RequireAndVerifyClientCert, clientCAs
	}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func get(t *testing.T, d Dialer, u string) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := d.Client().Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// dialTarget connects to workerURL the way the routed path does (Target, then Dial), and closes
// the connection after the handshake.
func dialTarget(t *testing.T, d Dialer, workerURL string) error {
	t.Helper()
	c, _, err := dialAsRouted(t, d, workerURL)
	if err != nil {
		return err
	}
	return c.Close()
}

// dialAsRouted connects to workerURL the way the routed path does: Target, then Dial, within 10 s.
func dialAsRouted(t *testing.T, d Dialer, workerURL string) (net.Conn, Target, error) {
	t.Helper()
	target, err := d.Target(workerURL)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := d.Dial(ctx, target)
	return c, target, err
}

func TestDialerTrustsTheConfiguredCAInsteadOfTheSystemRoots(t *testing.T) {
	ca := testkit.NewCA(t, "test CA")
	srv := startTLSWorker(t, ca, nil)
	trusting := Dialer{Timeouts: Timeouts{Dial: 5 * time.Second}, TLS: NewTLS(ca.Pool(), nil)}
	if err := get(t, trusting, srv.URL+"/health"); err != nil {
		t.Fatalf("client trusting the test CA: %v", err)
	}
	if err := dialTarget(t, trusting, srv.URL); err != nil {
		t.Fatalf("dial trusting the test CA: %v", err)
	}
	system := Dialer{Timeouts: Timeouts{Dial: 5 * time.Second}}
	var unknown x509.UnknownAuthorityError
	if err := get(t, system, srv.URL+"/health"); !errors.As(err, &unknown) {
		t.Fatalf("client with the system roots: err = %v, want an unknown authority", err)
	}
	if err := dialTarget(t, system, srv.URL); !errors.As(err, &unknown) {
		t.Fatalf("dial with the system roots: err = %v, want an unknown authority", err)
	}
}

func TestDialerPresentsTheClientCertificateToAWorkerThatRequiresOne(t *testing.T) {
	ca := testkit.NewCA(t, "test CA")
	srv := startTLSWorker(t, ca, ca.Pool())
	client := ca.Issue(t, 3, true).TLS()
	with := Dialer{TLS: NewTLS(ca.Pool(), func() *tls.Certificate { return &client })}
	if err := get(t, with, srv.URL+"/health"); err != nil {
		t.Fatalf("client with a certificate: %v", err)
	}
	// TLS 1.3 reports a refused client certificate on the first read, not in the handshake, so
	// the routed path's way is checked by a request over the dialled connection.
	if err := dialAndAsk(t, with, srv.URL); err != nil {
		t.Fatalf("dial with a certificate: %v", err)
	}
	without := Dialer{TLS: NewTLS(ca.Pool(), nil)}
	if err := get(t, without, srv.URL+"/health"); err == nil {
		t.Fatal("a worker that requires a client certificate answered a client without one")
	}
	if err := dialAndAsk(t, without, srv.URL); err == nil {
		t.Fatal("a worker that requires a client certificate answered a dial without one")
	}
}

// dialAndAsk dials workerURL as the routed path does and reads the answer to one GET.
func dialAndAsk(t *testing.T, d Dialer, workerURL string) error {
	t.Helper()
	c, target, err := dialAsRouted(t, d, workerURL)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, "GET /health HTTP/1.1\r\nHost: "+target.Host+"\r\nConnection: close\r\n\r\n"); err != nil {
		return err
	}
	answer, err := io.ReadAll(c)
	if err != nil {
		return err
	}
	if !strings.HasPrefix(string(answer), "HTTP/1.1 200 ") {
		return errors.New("no 200 answer")
	}
	return nil
}

func TestDialerRefusesANameThatResolvesOutsideTheAllowList(t *testing.T) {
	srv := httptest.NewServer(&recorder{auth: map[string]string{}})
	t.Cleanup(srv.Close)
	_, port, _ := net.SplitHostPort(srv.Listener.Addr().String())
	byName := "http://localhost:" + port // resolves to 127.0.0.1 (and perhaps ::1)

	elsewhere, err := tenant.ParseAllowed([]string{"127.0.0.2"})
	if err != nil {
		t.Fatal(err)
	}
	refused := Dialer{Allowed: elsewhere}
	if err := get(t, refused, byName+"/health"); !errors.Is(err, tenant.ErrNotAllowed) {
		t.Fatalf("client: err = %v, want %v", err, tenant.ErrNotAllowed)
	}
	if err := dialTarget(t, refused, byName); !errors.Is(err, tenant.ErrNotAllowed) {
		t.Fatalf("dial: err = %v, want %v", err, tenant.ErrNotAllowed)
	}

	here, err := tenant.ParseAllowed([]string{"127.0.0.1/32"})
	if err != nil {
		t.Fatal(err)
	}
	allowed := Dialer{Allowed: here}
	if err := get(t, allowed, byName+"/health"); err != nil {
		t.Fatalf("client, the resolved address allowed: %v", err)
	}
	if err := dialTarget(t, allowed, byName); err != nil {
		t.Fatalf("dial, the resolved address allowed: %v", err)
	}
}

func TestAuthorizationIsTheKeyElseTheURLsUserinfoElseNone(t *testing.T) {
	for _, tc := range []struct {
		key, url, want string
	}{
		{"k1", "http://127.0.0.1:8000", "Bearer k1"},
		{"k1", "http://u:p@127.0.0.1:8000", "Bearer k1"},
		{"", "http://u:p@127.0.0.1:8000", "Basic dTpw"},
		{"", "http://u@127.0.0.1:8000/prefix", "Basic dTo="},
		{"", "http://127.0.0.1:8000", ""},
	} {
		d := Dialer{APIKey: tc.key}
		if got := d.Authorization(tc.url); got != tc.want {
			t.Errorf("key %q, %s: Authorization = %q, want %q", tc.key, tc.url, got, tc.want)
		}
		target, err := d.Target(tc.url)
		if err != nil {
			t.Fatal(err)
		}
		if target.Authorization != tc.want {
			t.Errorf("key %q, %s: Target.Authorization = %q, want %q", tc.key, tc.url, target.Authorization, tc.want)
		}
	}
}

func TestClientSendsTheWorkersCredentialOnEveryRequest(t *testing.T) {
	rec := &recorder{auth: map[string]string{}}
	srv := httptest.NewServer(rec)
	t.Cleanup(srv.Close)
	u, _ := url.Parse(srv.URL)
	u.User = url.UserPassword("u", "p")
	withUser := u.String()

	// net/http would send the URL's user:password as Basic; with a key, the key wins, as on the
	// routed path.
	if err := get(t, Dialer{APIKey: "k1"}, withUser+"/health"); err != nil {
		t.Fatal(err)
	}
	if got := rec.seen("/health"); got != "Bearer k1" {
		t.Errorf("with a key and a URL's user: Authorization = %q, want the key", got)
	}
	if err := get(t, Dialer{}, withUser+"/v1/models"); err != nil {
		t.Fatal(err)
	}
	if got := rec.seen("/v1/models"); got != "Basic dTpw" {
		t.Errorf("with a URL's user only: Authorization = %q, want its Basic credentials", got)
	}
	if err := get(t, Dialer{APIKey: "k1"}, srv.URL+"/tokenize"); err != nil {
		t.Fatal(err)
	}
	if got := rec.seen("/tokenize"); got != "Bearer k1" {
		t.Errorf("with a key: Authorization = %q, want the key", got)
	}
}
