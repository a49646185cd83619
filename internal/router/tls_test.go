package router

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// testPKI is a certificate authority made for one test, with the files it writes in dir.
type testPKI struct {
	*testkit.CA
	t      *testing.T
	dir    string
	caFile string
}

func newTestPKI(t *testing.T) *testPKI {
	t.Helper()
	p := &testPKI{CA: testkit.NewCA(t, "cacheroute test CA"), t: t, dir: t.TempDir()}
	p.caFile = filepath.Join(p.dir, "ca.pem")
	replaceFile(t, p.caFile, p.PEM)
	return p
}

// writePair issues a certificate and writes it to name.pem and name-key.pem in the PKI's
// directory, replacing any earlier pair of that name the way a rotation does: key first, each by
// renaming a new file over the old.
func (p *testPKI) writePair(name string, serial int64, client bool) (certFile, keyFile string) {
	p.t.Helper()
	leaf := p.Issue(p.t, serial, client)
	certFile, keyFile = filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	replaceFile(p.t, keyFile, leaf.KeyPEM)
	replaceFile(p.t, certFile, leaf.CertPEM)
	return certFile, keyFile
}

func replaceFile(t *testing.T, path string, data []byte) {
	t.Helper()
	tmp := path + ".new"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, path); err != nil {
		t.Fatal(err)
	}
}

// tlsTestRouter is a router serving TLS on loopback: the traffic listener and the metrics one.
type tlsTestRouter struct {
	*Router
	addr, metricsAddr string
	url               string // https://addr
}

// tlsConfig is a test configuration whose listeners serve the PKI's server certificate, written
// to server.pem / server-key.pem with serial 100.
func tlsConfig(p *testPKI) config.Config {
	cfg := testConfig()
	cfg.TLSCertFile, cfg.TLSKeyFile = p.writePair("server", 100, false)
	return cfg
}

func startTLSRouter(t *testing.T, cfg config.Config, ws ...*fakeWorker) *tlsTestRouter {
	t.Helper()
	r, err := New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln := testkit.Listen(t)
	mln := testkit.Listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	addWorkers(t, ctx, r, ws)
	testkit.Go(t, cancel, func() error { return r.Serve(ctx, ln, mln) })
	return &tlsTestRouter{Router: r, addr: ln.Addr().String(), metricsAddr: mln.Addr().String(), url: "https://" + ln.Addr().String()}
}

// httpsClient trusts roots and presents cert, if any; its requests give up after 10 s.
func httpsClient(t *testing.T, roots *x509.CertPool, cert *tls.Certificate) *http.Client {
	cfg := &tls.Config{RootCAs: roots}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{*cert}
	}
	tr := &http.Transport{TLSClientConfig: cfg}
	t.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr, Timeout: 10 * time.Second}
}

const tlsChatBody = `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`

// postTLSChat posts a chat request to tr with a client that trusts p.
func postTLSChat(t *testing.T, tr *tlsTestRouter, p *testPKI) *http.Response {
	t.Helper()
	resp, err := httpsClient(t, p.Pool(), nil).Post(tr.url+"/v1/chat/completions", "application/json", strings.NewReader(tlsChatBody))
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// wantSerial completes one handshake with addr and fails unless the certificate it presented has
// serial number want.
func wantSerial(t *testing.T, addr string, roots *x509.CertPool, want int64, when string) {
	t.Helper()
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: roots})
	if err != nil {
		t.Fatalf("handshake with %s: %v", addr, err)
	}
	defer c.Close()
	if got := c.ConnectionState().PeerCertificates[0].SerialNumber.Int64(); got != want {
		t.Fatalf("%s: serial %d, want %d", when, got, want)
	}
}

// newTLSWorker is a fakeWorker served over TLS with serverTLS; handshake errors go to errLog.
func newTLSWorker(t *testing.T, serverTLS *tls.Config, errLog io.Writer) *fakeWorker {
	t.Helper()
	f := newFakeWorker(t)
	ts := httptest.NewUnstartedServer(f.srv.Config.Handler)
	ts.TLS = serverTLS
	if errLog != nil {
		ts.Config.ErrorLog = log.New(errLog, "", 0)
	}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	f.srv = ts
	return f
}

func TestRouterOverTLSAnswersAClientThatTrustsItsCA(t *testing.T) {
	p := newTestPKI(t)
	w := newFakeWorker(t)
	tr := startTLSRouter(t, tlsConfig(p), w)
	resp := postTLSChat(t, tr, p)
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, `"content":"hello"`) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	if resp.TLS == nil || resp.TLS.Version < tls.VersionTLS12 {
		t.Fatalf("connection state %+v, want TLS 1.2 or later", resp.TLS)
	}
	if _, h := w.last(); h.Get("X-Forwarded-Proto") != "https" {
		t.Errorf("worker saw X-Forwarded-Proto %q, want https", h.Get("X-Forwarded-Proto"))
	}
	resp, err := httpsClient(t, p.Pool(), nil).Get(tr.url + "/health")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != 200 {
		t.Fatalf("/health over TLS: %d %s", resp.StatusCode, body)
	}
}

func TestMetricsListenerServesTLSToo(t *testing.T) {
	p := newTestPKI(t)
	tr := startTLSRouter(t, tlsConfig(p))
	resp, err := httpsClient(t, p.Pool(), nil).Get("https://" + tr.metricsAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, "vllm_router_") {
		t.Fatalf("metrics over TLS: %d %.200s", resp.StatusCode, body)
	}
	// Plain HTTP gets no metrics: net/http answers 400 to a request that is not a handshake.
	plain := &http.Client{Timeout: 10 * time.Second}
	if resp, err := plain.Get("http://" + tr.metricsAddr + "/metrics"); err == nil {
		body := readAll(t, resp)
		if resp.StatusCode == 200 {
			t.Fatalf("plain HTTP to the TLS metrics port got 200: %.200s", body)
		}
	}
}

func TestPlainHTTPClientToTheTLSPortFails(t *testing.T) {
	p := newTestPKI(t)
	w := newFakeWorker(t)
	tr := startTLSRouter(t, tlsConfig(p), w)
	plain := &http.Client{Timeout: 10 * time.Second}
	resp, err := plain.Post("http://"+tr.addr+"/v1/chat/completions", "application/json", strings.NewReader(tlsChatBody))
	if err == nil {
		body := readAll(t, resp)
		t.Fatalf("plain HTTP to the TLS port got an answer: %d %s", resp.StatusCode, body)
	}
	if n := w.hits.Load(); n != 0 {
		t.Fatalf("worker got %d requests from a plain-HTTP client", n)
	}
}

func TestClientsBelowTLS12AreRefused(t *testing.T) {
	p := newTestPKI(t)
	tr := startTLSRouter(t, tlsConfig(p))
	_, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", tr.addr,
		&tls.Config{RootCAs: p.Pool(), MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11})
	if err == nil || !strings.Contains(err.Error(), "remote error") {
		t.Fatalf("a TLS 1.1 handshake: %v, want the router to refuse it", err)
	}
}

// A client that connects and says nothing, or starts its hello and stalls, is disconnected once
// the client header timeout has passed: the handshake cannot hold a connection for ever.
func TestSilentOrStalledTLSClientIsDisconnected(t *testing.T) {
	p := newTestPKI(t)
	cfg := tlsConfig(p)
	cfg.ClientHeaderTimeoutSecs = 0.3
	tr := startTLSRouter(t, cfg)
	for name, send := range map[string][]byte{
		"silent":            nil,
		"stalled mid-hello": {0x16, 0x03, 0x01, 0x01, 0x00, 0x01}, // a record header promising 256 bytes, then one
	} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", tr.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			if len(send) > 0 {
				if _, err := c.Write(send); err != nil {
					t.Fatal(err)
				}
			}
			_ = c.SetReadDeadline(time.Now().Add(10 * time.Second)) // far past the header timeout
			_, err = io.ReadAll(c)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatal("the router still held the connection after 10 s")
			}
		})
	}
}

// The cap on client connections holds under TLS: a connection over it is closed without a
// handshake, and a place freed is taken again.
func TestConnectionCapHoldsUnderTLS(t *testing.T) {
	p := newTestPKI(t)
	cfg := tlsConfig(p)
	cfg.MaxClientConnections = 1
	tr := startTLSRouter(t, cfg)
	dial := func() (*tls.Conn, error) {
		c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", tr.addr, &tls.Config{RootCAs: p.Pool()})
		if err != nil {
			return nil, err
		}
		// A handshake the server did not finish shows on the first read: ask for something.
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET /liveness HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			c.Close()
			return nil, err
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			c.Close()
			return nil, err
		}
		resp.Body.Close()
		return c, nil
	}
	held, err := dial()
	if err != nil {
		t.Fatal(err)
	}
	if over, err := dial(); err == nil {
		over.Close()
		held.Close()
		t.Fatal("a connection over the cap was served")
	}
	held.Close()
	testkit.WaitFor(t, "a place to free up", func() bool {
		c, err := dial()
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// The accept loop under TLS still survives running out of file descriptors.
func TestTLSListenerKeepsAcceptingThroughRunningOutOfFileDescriptors(t *testing.T) {
	p := newTestPKI(t)
	certFile, keyFile := p.writePair("server", 7, false)
	rl, err := newCertReloader(certFile, keyFile, "TLS certificate", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	ln := testkit.Listen(t)
	defer ln.Close()
	flaky := &flakyListener{Listener: ln, err: &net.OpError{Op: "accept", Err: syscall.EMFILE}}
	flaky.failures.Store(3)
	l := tlsListener(retryAccept(flaky, slog.New(slog.DiscardHandler)), rl.serverConfig(), 5*time.Second)
	go func() {
		c, err := l.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		_, _ = c.Read(make([]byte, 1)) // runs the handshake
	}()
	wantSerial(t, ln.Addr().String(), p.Pool(), 7, "the listener")
}

func TestCertificateRotatesOnReload(t *testing.T) {
	p := newTestPKI(t)
	tr := startTLSRouter(t, tlsConfig(p))
	wantSerial(t, tr.addr, p.Pool(), 100, "before rotation")
	p.writePair("server", 200, false)
	if err := tr.ReloadCertificates(); err != nil {
		t.Fatal(err)
	}
	wantSerial(t, tr.addr, p.Pool(), 200, "after rotation")
	wantSerial(t, tr.metricsAddr, p.Pool(), 200, "the metrics listener after rotation")
	// A broken file is refused and the certificate in use stays.
	replaceFile(t, filepath.Join(p.dir, "server.pem"), []byte("not a certificate"))
	if err := tr.ReloadCertificates(); err == nil || !strings.Contains(err.Error(), "--tls-cert-file") {
		t.Fatalf("reloading a broken file: %v, want an error naming --tls-cert-file", err)
	}
	wantSerial(t, tr.addr, p.Pool(), 200, "after a failed reload")
}

// Without a reload call, changed files are picked up by the next handshake after the periodic
// look at them comes due (made due here at once, rather than waiting for it).
func TestCertificateRotatesWhenTheFilesChange(t *testing.T) {
	p := newTestPKI(t)
	tr := startTLSRouter(t, tlsConfig(p))
	wantSerial(t, tr.addr, p.Pool(), 100, "before rotation")
	p.writePair("server", 300, false)
	tr.certs.nextCheck.Store(0)
	wantSerial(t, tr.addr, p.Pool(), 300, "after the files changed")
}

func TestCertificateThatFailsToLoadKeepsTheOneInUseAndIsLoggedOnce(t *testing.T) {
	p := newTestPKI(t)
	certFile, keyFile := p.writePair("server", 1, false)
	var logs testkit.SyncBuffer
	rl, err := newCertReloader(certFile, keyFile, "TLS certificate", slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	serial := func() int64 {
		leaf, err := x509.ParseCertificate(rl.current().Certificate[0])
		if err != nil {
			t.Fatal(err)
		}
		return leaf.SerialNumber.Int64()
	}
	// A new certificate whose key has not been written yet: the pair does not match.
	certPEM := p.Issue(t, 2, false).CertPEM
	replaceFile(t, certFile, certPEM)
	for range 3 {
		rl.nextCheck.Store(0)
		if got := serial(); got != 1 {
			t.Fatalf("serial %d while the new pair is incomplete, want 1", got)
		}
	}
	if n := strings.Count(logs.String(), "not loaded"); n != 1 {
		t.Fatalf("the failure was logged %d times, want once:\n%s", n, logs.String())
	}
	p.writePair("server", 3, false) // the rotation completes
	rl.nextCheck.Store(0)
	if got := serial(); got != 3 {
		t.Fatalf("serial %d after the rotation completed, want 3", got)
	}
}

func TestHTTPSWorkerIsReachedWithTheWorkerCAFile(t *testing.T) {
	p := newTestPKI(t)
	w := newTLSWorker(t, &tls.Config{Certificates: []tls.Certificate{p.Issue(t, 10, false).TLS()}}, nil)
	cfg := testConfig()
	cfg.WorkerCAFile = p.caFile
	tr := startRouter(t, cfg, w)
	if !tr.Pool().Get(w.URL())[0].Healthy() {
		t.Fatal("the https worker did not pass its health check")
	}
	resp := tr.post(t, "/v1/chat/completions", tlsChatBody)
	if body := readAll(t, resp); resp.StatusCode != 200 || !strings.Contains(body, `"content":"hello"`) {
		t.Fatalf("routed request to the https worker: %d %s", resp.StatusCode, body)
	}
	// The LoRA fan-out reaches it the same way.
	resp = tr.post(t, "/v1/load_lora_adapter", `{"lora_name":"a","lora_path":"/a"}`)
	body := readAll(t, resp)
	var answer struct {
		Results []struct{ Status int } `json:"results"`
	}
	if err := json.Unmarshal([]byte(body), &answer); err != nil || resp.StatusCode != 200 ||
		len(answer.Results) != 1 || answer.Results[0].Status != 200 {
		t.Fatalf("LoRA load through the https worker: %d %s", resp.StatusCode, body)
	}
}

func TestHTTPSWorkerIsNotTrustedWithoutTheWorkerCAFile(t *testing.T) {
	p := newTestPKI(t)
	var errLog testkit.SyncBuffer
	w := newTLSWorker(t, &tls.Config{Certificates: []tls.Certificate{p.Issue(t, 10, false).TLS()}}, &errLog)
	tr := startRouter(t, testConfig(), w) // system roots only
	if tr.Pool().Get(w.URL())[0].Healthy() {
		t.Fatal("a worker whose certificate no trusted CA signed passed its health check")
	}
	resp := tr.post(t, "/v1/chat/completions", tlsChatBody)
	if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("routed request: %d %s, want 503", resp.StatusCode, body)
	}
	if n := w.hits.Load(); n != 0 {
		t.Fatalf("the untrusted worker got %d requests", n)
	}
	testkit.WaitFor(t, "the worker to log the refused handshake", func() bool { return strings.Contains(errLog.String(), "TLS handshake error") })
}

func TestMutualTLSWorkerIsReachedWithTheClientCertificateAndRefusedWithout(t *testing.T) {
	p := newTestPKI(t)
	var errLog testkit.SyncBuffer
	w := newTLSWorker(t, &tls.Config{
		Certificates: []tls.Certificate{p.Issue(t, 10, false).TLS()},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    p.Pool(),
	}, &errLog)

	t.Run("with the client certificate", func(t *testing.T) {
		cfg := testConfig()
		cfg.WorkerCAFile = p.caFile
		cfg.WorkerClientCertFile, cfg.WorkerClientKeyFile = p.writePair("client", 20, true)
		tr := startRouter(t, cfg, w)
		if !tr.Pool().Get(w.URL())[0].Healthy() {
			t.Fatalf("the mTLS worker did not pass its health check:\n%s", errLog.String())
		}
		resp := tr.post(t, "/v1/chat/completions", tlsChatBody)
		if body := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("routed request: %d %s", resp.StatusCode, body)
		}
		if n := w.hits.Load(); n != 1 {
			t.Fatalf("worker got %d routed requests, want 1", n)
		}
	})
	t.Run("without one", func(t *testing.T) {
		hits := w.hits.Load()
		cfg := testConfig()
		cfg.WorkerCAFile = p.caFile
		tr := startRouter(t, cfg, w)
		if tr.Pool().Get(w.URL())[0].Healthy() {
			t.Fatal("the mTLS worker passed a health check made without a client certificate")
		}
		resp := tr.post(t, "/v1/chat/completions", tlsChatBody)
		if body := readAll(t, resp); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("routed request: %d %s, want 503", resp.StatusCode, body)
		}
		if n := w.hits.Load(); n != hits {
			t.Fatalf("worker got %d more requests without a client certificate", n-hits)
		}
		testkit.WaitFor(t, "the worker to refuse the handshake for want of a certificate", func() bool {
			return strings.Contains(errLog.String(), "certificate")
		})
	})
}

// The client watch (closing the worker's connection when the client leaves) sees a TLS client
// go: one whose connection drops (the TCP socket closed under TLS, as a crash or a reset does),
// and one that says goodbye first with a TLS close_notify alert.
func TestClientLeavingOverTLSCancelsTheWorkersRequest(t *testing.T) {
	for _, polite := range []bool{false, true} {
		name := map[bool]string{false: "connection dropped", true: "close_notify then close"}[polite]
		t.Run(name, func(t *testing.T) {
			p := newTestPKI(t)
			w := newFakeWorker(t)
			canceled := w.streamUntilCanceled()
			tr := startTLSRouter(t, tlsConfig(p), w)
			c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", tr.addr, &tls.Config{RootCAs: p.Pool()})
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			body := `{"stream":true,"messages":[]}`
			fmt.Fprintf(c, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			br := bufio.NewReader(c)
			for { // through the headers to the first event
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatal(err)
				}
				if strings.HasPrefix(line, "data:") {
					break
				}
			}
			if polite {
				c.Close()
			} else {
				c.NetConn().Close()
			}
			select {
			case <-canceled:
			case <-time.After(5 * time.Second):
				t.Fatal("the worker's request was not canceled after the TLS client left")
			}
		})
	}
}

func TestStartupRefusesTLSFilesThatDoNotLoad(t *testing.T) {
	p := newTestPKI(t)
	certFile, keyFile := p.writePair("server", 1, false)
	_, otherKey := p.writePair("other", 2, false)
	clientCert, clientKey := p.writePair("client", 3, true)
	garbage := filepath.Join(p.dir, "garbage.pem")
	replaceFile(t, garbage, []byte("not PEM at all\n"))
	missing := filepath.Join(p.dir, "absent.pem")
	tests := []struct {
		name   string
		mutate func(c *config.Config)
		want   string
	}{
		{"certificate without key", func(c *config.Config) { c.TLSCertFile = certFile }, "--tls-key-file: required with --tls-cert-file"},
		{"key without certificate", func(c *config.Config) { c.TLSKeyFile = keyFile }, "--tls-cert-file: required with --tls-key-file"},
		{"missing certificate file", func(c *config.Config) { c.TLSCertFile, c.TLSKeyFile = missing, keyFile }, "--tls-cert-file: cannot read the file"},
		{"certificate file that is not PEM", func(c *config.Config) { c.TLSCertFile, c.TLSKeyFile = garbage, keyFile }, "--tls-cert-file, --tls-key-file:"},
		{"key of another certificate", func(c *config.Config) { c.TLSCertFile, c.TLSKeyFile = certFile, otherKey }, "--tls-cert-file, --tls-key-file:"},
		{"worker CA file without a certificate", func(c *config.Config) { c.WorkerCAFile = garbage }, "--worker-ca-file: no PEM certificate"},
		{"worker client certificate without key", func(c *config.Config) { c.WorkerClientCertFile = clientCert }, "--worker-client-key-file: required with --worker-client-cert-file"},
		{"worker client key that does not match", func(c *config.Config) { c.WorkerClientCertFile, c.WorkerClientKeyFile = clientCert, keyFile }, "--worker-client-cert-file, --worker-client-key-file:"},
		{"redis CA file without a certificate", func(c *config.Config) {
			c.Policy, c.SessionStore, c.RedisURL, c.RedisCAFile = "cache_aware", "redis", "rediss://127.0.0.1:1", garbage
		}, "--redis-ca-file: no PEM certificate"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig()
			tt.mutate(&cfg)
			_, err := New(cfg, slog.New(slog.DiscardHandler))
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("New = %v, want an error with %q", err, tt.want)
			}
		})
	}
	t.Run("every file good", func(t *testing.T) {
		cfg := testConfig()
		cfg.TLSCertFile, cfg.TLSKeyFile = certFile, keyFile
		cfg.WorkerCAFile, cfg.WorkerClientCertFile, cfg.WorkerClientKeyFile = p.caFile, clientCert, clientKey
		cfg.Policy, cfg.SessionStore, cfg.RedisURL, cfg.RedisCAFile = "cache_aware", "redis", "rediss://127.0.0.1:1", p.caFile
		r, err := New(cfg, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatalf("New: %v", err)
		}
		_ = r.store.redis.Close()
	})
}

func TestRouterOverTLSStillTellsWorkersHTTPSAndAnswersOversizedHeadersInTheRouteShape(t *testing.T) {
	p := newTestPKI(t)
	w := newFakeWorker(t)
	tr := startTLSRouter(t, tlsConfig(p), w)
	resp := postTLSChat(t, tr, p)
	readAll(t, resp)
	if _, h := w.last(); h.Get("X-Forwarded-Proto") != "https" {
		t.Fatalf("X-Forwarded-Proto %q, want https", h.Get("X-Forwarded-Proto"))
	}
	req, _ := http.NewRequest(http.MethodPost, tr.url+"/v1/messages", strings.NewReader(`{}`))
	req.Header.Set("X-Big", strings.Repeat("a", 20<<10))
	resp, err := httpsClient(t, p.Pool(), nil).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body := readAll(t, resp)
	if resp.StatusCode != http.StatusRequestHeaderFieldsTooLarge || !strings.Contains(body, `"type":"error"`) || !strings.Contains(body, `"invalid_request_error"`) {
		t.Fatalf("%d %s; want 431 in the Anthropic shape", resp.StatusCode, body)
	}
}
