package proxy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// The helpers below build one router in front of a few test workers on 127.0.0.1: httptest
// servers for well-behaved workers, raw TCP listeners for workers that misbehave on the wire.
// Every wait is bounded; no test asserts how long anything took.

const chatPath = "/v1/chat/completions"

// chatBody is a non-streamed chat request; streamBody asks for a streamed answer.
const (
	chatBody   = `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
	streamBody = `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`
)

// testOptions are proxy options with every timeout generous, so that a test changes only the
// knob it is about.
func testOptions() Options {
	return Options{
		MaxPayloadSize:      1 << 20,
		MaxRetries:          2,
		InitialBackoff:      time.Millisecond,
		MaxBackoff:          5 * time.Millisecond,
		ClientHeaderTimeout: 20 * time.Second,
		ClientBodyTimeout:   20 * time.Second,
		KeepaliveTimeout:    20 * time.Second,
		Upstream: upstream.PoolOptions{
			Dialer:           upstream.Dialer{Timeouts: upstream.Timeouts{Dial: 2 * time.Second, Idle: time.Minute, Request: 20 * time.Second, Lookup: upstream.DefaultLookup}},
			MaxIdlePerWorker: 8,
		},
	}
}

// oneFailureBreaker opens a worker's breaker on its first failure, for a minute: a test reads the
// breaker's state to tell whether an outcome was counted as the worker's failure.
var oneFailureBreaker = &workers.Options{CBFailureThreshold: 1, CBTimeout: time.Minute}

// setup describes one test router; zero fields take the defaults of newTestProxy.
type setup struct {
	opts   *Options         // testOptions() when nil
	policy policy.Policy    // round robin (first registered worker first) when nil
	pool   *workers.Options // breaker opens after 3 failures, for a minute, when nil
	log    *slog.Logger     // discarded when nil
	urls   []string         // worker URLs, registered and marked healthy in this order
}

// OwnEndpointsForTests builds a test router's own endpoints over its pool: package routerapi's,
// with no admin key and no fleet (their tests are routerapi's). routerapi imports this package,
// so the external test file own_test.go sets it.
var OwnEndpointsForTests func(pool *workers.Pool, m *metrics.Metrics, opts Options) OwnEndpoints

// testProxy is a running router.
type testProxy struct {
	URL     string // http://127.0.0.1:port
	Addr    string // 127.0.0.1:port
	Server  *Server
	Pool    *workers.Pool
	Metrics *metrics.Metrics
	Client  *http.Client
}

// newTestProxy serves a router over the given workers on a loopback port until the test ends.
func newTestProxy(t *testing.T, cfg setup) *testProxy {
	t.Helper()
	opts := testOptions()
	if cfg.opts != nil {
		opts = *cfg.opts
	}
	poolOpts := workers.Options{CBFailureThreshold: 3, CBTimeout: time.Minute}
	if cfg.pool != nil {
		poolOpts = *cfg.pool
	}
	pool := workers.NewPool(poolOpts)
	for _, u := range cfg.urls {
		ws, err := pool.Add(u)
		if err != nil {
			t.Fatalf("add worker %s: %v", u, err)
		}
		for _, w := range ws {
			w.SetHealthy(true)
		}
	}
	p := cfg.policy
	if p == nil {
		p = &policy.RoundRobin{}
	}
	log := cfg.log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	m := metrics.New(pool)
	opts.Own = OwnEndpointsForTests(pool, m, opts)
	s := New(opts, pool, p, m, log)
	ln := testkit.Listen(t)
	srv := s.HTTPServer()
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(RecordRequestStarts(ln))
	}()
	transport := &http.Transport{DisableCompression: true, MaxIdleConnsPerHost: 16}
	tp := &testProxy{
		URL: "http://" + ln.Addr().String(), Addr: ln.Addr().String(),
		Server: s, Pool: pool, Metrics: m,
		Client: &http.Client{Transport: transport, Timeout: 30 * time.Second},
	}
	t.Cleanup(func() {
		transport.CloseIdleConnections()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.ShutdownWithContext(ctx)
		_ = ln.Close()
		s.CloseIdleConnections()
		select {
		case <-served:
		case <-time.After(5 * time.Second):
		}
	})
	return tp
}

// worker returns the tenant registered under url.
func (tp *testProxy) worker(t *testing.T, url string) *workers.Worker {
	t.Helper()
	ws := tp.Pool.Get(url)
	if len(ws) != 1 {
		t.Fatalf("worker %s: %d tenants registered", url, len(ws))
	}
	return ws[0]
}

// post sends body to path as JSON and returns the status, headers and whole body.
func (tp *testProxy) post(t *testing.T, path, body string, header ...string) (int, http.Header, string) {
	t.Helper()
	return testkit.Send(t, tp.Client, http.MethodPost, tp.URL+path, body, append([]string{"Content-Type", "application/json"}, header...)...)
}

// do sends a body-less request (GET, DELETE, ...) with optional header pairs.
func (tp *testProxy) do(t *testing.T, method, path string, header ...string) (int, http.Header, string) {
	t.Helper()
	return testkit.Send(t, tp.Client, method, tp.URL+path, "", header...)
}

// answer is how a request sent in the background ended: its status and body, or status 0 and
// the error when it got no answer.
type answer struct {
	status int
	body   string
}

// sendInBackground sends one request as testkit.Send does (a JSON body when body is not empty,
// then header as name, value pairs) on a goroutine of its own, and hands over its answer once it
// ends: for the tests whose request must still be waiting while they act on the router or its
// workers.
func (tp *testProxy) sendInBackground(method, path, body string, header ...string) <-chan answer {
	done := make(chan answer, 1)
	go func() {
		req, err := http.NewRequest(method, tp.URL+path, strings.NewReader(body))
		if err != nil {
			done <- answer{body: err.Error()}
			return
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range testkit.Header(header...) {
			req.Header[k] = v
		}
		resp, err := tp.Client.Do(req)
		if err != nil {
			done <- answer{body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		done <- answer{resp.StatusCode, string(b)}
	}()
	return done
}

// upstreamErrors is upstream_errors_total{kind}.
func (tp *testProxy) upstreamErrors(kind string) float64 {
	return testutil.ToFloat64(tp.Metrics.UpstreamErrors.WithLabelValues(kind))
}

// wantUpstreamErrors fails the test, going on, unless upstream_errors_total{kind} is want; note
// follows the failure.
func (tp *testProxy) wantUpstreamErrors(t *testing.T, kind string, want float64, note ...string) {
	t.Helper()
	if got := tp.upstreamErrors(kind); got != want {
		t.Errorf("upstream_errors_total{kind=%s} = %v, want %v%s", kind, got, want, strings.Join(note, ""))
	}
}

// wantRetries fails the test, going on, unless retries_total is want; note follows the failure.
func (tp *testProxy) wantRetries(t *testing.T, want float64, note ...string) {
	t.Helper()
	if got := testutil.ToFloat64(tp.Metrics.Retries); got != want {
		t.Errorf("retries_total = %v, want %v%s", got, want, strings.Join(note, ""))
	}
}

// requests is requests_total{route=chatPath, status_class}.
func (tp *testProxy) requests(class string) float64 {
	return testutil.ToFloat64(tp.Metrics.Requests.WithLabelValues(chatPath, class))
}

// loadReturnsToZero waits for every tenant's in-flight load to be given back.
func (tp *testProxy) loadReturnsToZero(t *testing.T) {
	t.Helper()
	for _, w := range tp.Pool.All() {
		testkit.WaitWithin(t, 5*time.Second, "load of "+w.Name()+" back to 0", func() bool { return w.Load() == 0 })
	}
}

// okWorker answers every request 200 with a JSON body naming itself.
func okWorker(t *testing.T, name string) *testkit.Server {
	return testkit.NamedServer(t, http.StatusOK, name)
}

// sseWorker streams n events, flushing each one, then ends the stream cleanly.
func sseWorker(t *testing.T, name string, n int) *testkit.Server {
	return testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range n {
			_, _ = fmt.Fprintf(w, "data: {\"worker\":%q,\"i\":%d}\n\n", name, i)
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
	})
}

// seenRequest is what a recordingWorker kept of one request it received.
type seenRequest struct {
	line   string      // "METHOD /path?query body"
	header http.Header // the request's headers as the worker got them
}

// recordingWorker answers every request with one status and JSON body, and keeps what it got of
// each request, in order: the tests of what the router hands a worker (paths, bodies, headers,
// keys, trace context) read it back. One worker serves them all, so that each test says only
// what it looks at.
type recordingWorker struct {
	*testkit.Server
	mu  sync.Mutex
	got []seenRequest
}

func newRecordingWorker(t *testing.T, status int, body string) *recordingWorker {
	rw := &recordingWorker{}
	rw.Server = testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		rw.mu.Lock()
		rw.got = append(rw.got, seenRequest{r.Method + " " + r.URL.RequestURI() + " " + string(b), r.Header.Clone()})
		rw.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	})
	return rw
}

// seen is a copy of what the worker kept so far, in the order the requests came.
func (rw *recordingWorker) seen() []seenRequest {
	rw.mu.Lock()
	defer rw.mu.Unlock()
	return append([]seenRequest(nil), rw.got...)
}

// lines is each request's "METHOD /path?query body", in order.
func (rw *recordingWorker) lines() []string {
	var out []string
	for _, r := range rw.seen() {
		out = append(out, r.line)
	}
	return out
}

// headerValues is each request's value of header name ("" where it had none), in order.
func (rw *recordingWorker) headerValues(name string) []string {
	var out []string
	for _, r := range rw.seen() {
		out = append(out, r.header.Get(name))
	}
	return out
}

// lastHeader is the headers of the last request the worker got, nil before the first.
func (rw *recordingWorker) lastHeader() http.Header {
	got := rw.seen()
	if len(got) == 0 {
		return nil
	}
	return got[len(got)-1].header
}

// signal is a channel closed once, however many times fire is called.
type signal struct {
	ch   chan struct{}
	once sync.Once
}

func newSignal() *signal { return &signal{ch: make(chan struct{})} }
func (s *signal) fire()  { s.once.Do(func() { close(s.ch) }) }

// wait fails the test when the signal does not fire within d.
func (s *signal) wait(t *testing.T, d time.Duration, what string) {
	t.Helper()
	select {
	case <-s.ch:
	case <-time.After(d):
		t.Fatalf("not within %v: %s", d, what)
	}
}

// hangingWorker reads each request in full and never answers; the connection stays open until
// the router closes it (or the test ends).
func hangingWorker(t *testing.T) *testkit.RawServer {
	return testkit.NewRawServer(t, func(rw *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if _, _, err := rw.ReadRequest(br); err != nil {
			return
		}
		_, _ = io.Copy(io.Discard, br) // until the router closes the connection
	})
}

// roundTrip writes one request on c and reads its whole answer, keeping c open.
func roundTrip(t *testing.T, c net.Conn, req string) int {
	t.Helper()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	defer func() { _ = c.SetDeadline(time.Time{}) }()
	if _, err := io.WriteString(c, req); err != nil {
		t.Fatalf("write: %v", err)
	}
	// The router sends nothing unasked on a connection, so a fresh bufio.Reader per answer loses
	// no byte of the next one.
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("read answer: %v", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	return resp.StatusCode
}

// closedPort returns the URL of a loopback port nothing listens on: dialing it is refused. A
// socket bound to the port, never listening, holds it until the test ends. A port only closed
// again could be handed to the next listener opened, a worker of the same test included, which
// would then answer for the dead worker.
func closedPort(t *testing.T) string {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}

// rawRequest is an HTTP/1.1 request written by hand: the header lines exactly as given (the router
// sees what a net/http client would have normalised or refused), and for a POST its body.
func rawRequest(method, path, body string, headers ...string) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %s HTTP/1.1\r\nHost: router\r\n", method, path)
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	if body != "" || method == http.MethodPost {
		fmt.Fprintf(&b, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	b.WriteString("\r\n")
	b.WriteString(body)
	return b.String()
}

// dial opens a client connection to the router.
func (tp *testProxy) dial(t *testing.T) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", tp.Addr, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// streamToANonReader sends a streamed chat request on a connection of its own that never reads
// the answer.
func (tp *testProxy) streamToANonReader(t *testing.T) net.Conn {
	t.Helper()
	c := tp.dial(t)
	if _, err := io.WriteString(c, rawRequest(http.MethodPost, chatPath, streamBody)); err != nil {
		t.Fatal(err)
	}
	return c
}

// waitClosed reads from c until the router closes it, and fails the test when that does not
// happen within the bound. It returns everything read before the close.
func waitClosed(t *testing.T, c net.Conn, within time.Duration) []byte {
	t.Helper()
	_ = c.SetReadDeadline(time.Now().Add(within))
	var got []byte
	buf := make([]byte, 4096)
	for {
		n, err := c.Read(buf)
		got = append(got, buf[:n]...)
		if err == nil {
			continue
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Fatalf("the router did not close the connection within %v (read so far: %q)", within, got)
		}
		return got // io.EOF, or a reset: either way the router closed it
	}
}

// errorCode returns error.code of an OpenAI-shaped error body, failing the test when body is not
// one.
func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e apiError
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code == "" {
		t.Fatalf("not an OpenAI error body (%v): %q", err, body)
	}
	return e.Error.Code
}

// wantErrorAnswer stops the test unless the answer is status with an OpenAI error body of code:
// the router's own answer when no worker's answer could be relayed.
func wantErrorAnswer(t *testing.T, status int, body string, wantStatus int, wantCode string) {
	t.Helper()
	if status != wantStatus || errorCode(t, body) != wantCode {
		t.Fatalf("got %d %q, want %d %s", status, body, wantStatus, wantCode)
	}
}

// anthropicErrorType is the error type of an Anthropic error body, failing the test on any other
// body.
func anthropicErrorType(t *testing.T, body string) string {
	t.Helper()
	var e anthropicError
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Type != "error" || e.Error.Type == "" || e.Error.Message == "" {
		t.Fatalf("not an Anthropic error body (%v): %q", err, body)
	}
	return e.Error.Type
}
