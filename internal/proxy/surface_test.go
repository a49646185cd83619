package proxy

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// What a client or a worker can see of the router: request ids, method errors, forwarding
// headers, hop-by-hop headers, worker credentials, the health body, the admin key, error
// messages and the payload limit.

var generatedID = regexp.MustCompile(`^[0-9a-f]{32}$`)

func TestSurface_ValidRequestIDIsEchoedAndForwarded(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{}`)
	tp := newTestProxy(t, setup{urls: []string{w.URL}})
	for _, id := range []string{"req-42_abc.DEF~!", strings.Repeat("a", MaxRequestIDLen)} {
		status, h, body := tp.post(t, chatPath, chatBody, HeaderRequestID, id)
		if status != http.StatusOK {
			t.Fatalf("got %d %q", status, body)
		}
		if got := h.Get(HeaderRequestID); got != id {
			t.Errorf("echoed %s = %q, want %q", HeaderRequestID, got, id)
		}
		if got := w.lastHeader().Get(HeaderRequestID); got != id {
			t.Errorf("worker got %s = %q, want %q", HeaderRequestID, got, id)
		}
	}
}

func TestSurface_InvalidRequestIDIsReplacedByAGeneratedOne(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{}`)
	tp := newTestProxy(t, setup{urls: []string{w.URL}})
	cases := map[string]string{
		"129 characters": strings.Repeat("a", MaxRequestIDLen+1),
		"non-ASCII byte": "abc\xffdef",
		"inner space":    "abc def",
	}
	for name, id := range cases {
		t.Run(name, func(t *testing.T) {
			c := tp.dial(t) // raw, so the id reaches the router exactly as written
			_ = c.SetDeadline(time.Now().Add(10 * time.Second))
			_, _ = io.WriteString(c, rawRequest(http.MethodPost, chatPath, chatBody, HeaderRequestID+": "+id))
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				t.Fatalf("reading the answer: %v", err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				t.Fatalf("status %d", resp.StatusCode)
			}
			got := resp.Header.Get(HeaderRequestID)
			if !generatedID.MatchString(got) {
				t.Errorf("echoed %s = %q, want a generated 32-hex id", HeaderRequestID, got)
			}
			if fwd := w.lastHeader().Get(HeaderRequestID); fwd != got {
				t.Errorf("worker got %s = %q, want the generated %q", HeaderRequestID, fwd, got)
			}
		})
	}
}

func TestSurface_MethodNotAllowedOnARoutedPath(t *testing.T) {
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "w").URL}})
	for _, rt := range routeTable {
		path := strings.Replace(rt.path, "{id}", "resp_1", 1)
		status, h, body := tp.do(t, http.MethodPut, path)
		if status != http.StatusMethodNotAllowed {
			t.Fatalf("PUT %s: %d, want 405", path, status)
		}
		allow := "POST"
		if rt.methods != nil {
			allow = strings.Join(rt.methods, ", ")
		}
		if got := h.Get("Allow"); got != allow {
			t.Errorf("PUT %s: Allow %q, want %q", path, got, allow)
		}
		if rt.errors == anthropicErrors {
			if typ := anthropicErrorType(t, body); typ != "invalid_request_error" {
				t.Errorf("PUT %s: Anthropic error type %q", path, typ)
			}
		} else if code := errorCode(t, body); code != "method_not_allowed" {
			t.Errorf("PUT %s: error code %q", path, code)
		}
	}
}

func TestSurface_MethodNotAllowedOnAnEndpointThatIsNotRouted(t *testing.T) {
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "w").URL}})
	for _, tc := range []struct{ method, path, allow string }{
		{http.MethodDelete, "/health", "GET"},
		{http.MethodPost, "/metrics", "GET"},
		{http.MethodPut, "/workers", "GET, POST"},
	} {
		status, h, body := tp.do(t, tc.method, tc.path)
		if status != http.StatusMethodNotAllowed {
			t.Errorf("%s %s: %d, want 405", tc.method, tc.path, status)
			continue
		}
		if got := h.Get("Allow"); got != tc.allow {
			t.Errorf("%s %s: Allow %q, want %q", tc.method, tc.path, got, tc.allow)
		}
		if code := errorCode(t, body); code != "method_not_allowed" {
			t.Errorf("%s %s: error code %q", tc.method, tc.path, code)
		}
	}
}

func TestSurface_ForwardedHeadersReachTheWorker(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{}`)
	tp := newTestProxy(t, setup{urls: []string{w.URL}})

	tp.post(t, chatPath, chatBody)
	if got := w.lastHeader().Get(HeaderForwardedFor); got != "127.0.0.1" {
		t.Errorf("%s = %q, want the client's address 127.0.0.1", HeaderForwardedFor, got)
	}
	if got := w.lastHeader().Get(HeaderForwardedProto); got != "http" {
		t.Errorf("%s = %q, want http", HeaderForwardedProto, got)
	}

	tp.post(t, chatPath, chatBody, HeaderForwardedFor, "203.0.113.7", HeaderForwardedProto, "https")
	if got := w.lastHeader().Values(HeaderForwardedFor); len(got) != 1 || got[0] != "203.0.113.7, 127.0.0.1" {
		t.Errorf("%s = %q, want the client's address appended to the one it sent", HeaderForwardedFor, got)
	}
	if got := w.lastHeader().Get(HeaderForwardedProto); got != "https" {
		t.Errorf("%s = %q, want the client's own https (a TLS terminator in front) kept", HeaderForwardedProto, got)
	}
}

// Several X-Forwarded-For lines are one comma-separated list (RFC 9110 section 5.3): every address
// reaches the worker in order, with the client's own address last, where a worker that trusts
// only the nearest hop looks for it.
func TestSurface_SeveralForwardedForLinesKeepEveryAddressInOrder(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{}`)
	tp := newTestProxy(t, setup{urls: []string{w.URL}})

	c := tp.dial(t)
	if status := roundTrip(t, c, rawRequest(http.MethodPost, chatPath, chatBody,
		HeaderForwardedFor+": 203.0.113.7", HeaderForwardedFor+": 198.51.100.2")); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	if got := w.lastHeader().Values(HeaderForwardedFor); strings.Join(got, ", ") != "203.0.113.7, 198.51.100.2, 127.0.0.1" {
		t.Errorf("two %s lines reached the worker as the lines %q, want the addresses in order and the client's last",
			HeaderForwardedFor, got)
	}
}

// hopRequestHeaders are the client's hop-by-hop headers, each with a value no worker header has.
var hopRequestHeaders = []string{
	"Connection: keep-alive, X-Client-Hop",
	"X-Client-Hop: hop-value",
	"Keep-Alive: timeout=5",
	"Te: trailers",
	"Upgrade: websocket",
	"Proxy-Authorization: Basic cHJveHk6cGFzcw==",
	"Proxy-Connection: keep-alive",
	"X-End-To-End: kept",
}

func TestSurface_HopByHopRequestHeadersAreNotForwarded(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{}`)
	tp := newTestProxy(t, setup{urls: []string{w.URL}})

	c := tp.dial(t)
	if status := roundTrip(t, c, rawRequest(http.MethodPost, chatPath, chatBody, hopRequestHeaders...)); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	got := w.lastHeader()
	for _, name := range []string{"Connection", "X-Client-Hop", "Keep-Alive", "Te", "Upgrade", "Proxy-Authorization", "Proxy-Connection"} {
		if v := got.Values(name); len(v) > 0 {
			t.Errorf("the worker got hop-by-hop %s: %q", name, v)
		}
	}
	if v := got.Get("X-End-To-End"); v != "kept" {
		t.Errorf("end-to-end header X-End-To-End = %q, want kept", v)
	}
}

// Several Connection lines are one list (RFC 9110 section 5.3): a header named in any of them is
// hop-by-hop, in either direction.
func TestSurface_HeadersNamedInAnyConnectionLineAreNotForwarded(t *testing.T) {
	t.Run("request", func(t *testing.T) {
		w := newRecordingWorker(t, http.StatusOK, `{}`)
		tp := newTestProxy(t, setup{urls: []string{w.URL}})
		c := tp.dial(t)
		req := rawRequest(http.MethodPost, chatPath, chatBody,
			"Connection: X-Hop-A", "Connection: X-Hop-B", "X-Hop-A: a", "X-Hop-B: b", "X-End-To-End: kept")
		if status := roundTrip(t, c, req); status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
		got := w.lastHeader()
		for _, name := range []string{"X-Hop-A", "X-Hop-B", "Connection"} {
			if v := got.Values(name); len(v) > 0 {
				t.Errorf("the worker got hop-by-hop %s: %q", name, v)
			}
		}
		if v := got.Get("X-End-To-End"); v != "kept" {
			t.Errorf("end-to-end header X-End-To-End = %q, want kept", v)
		}
	})
	t.Run("response", func(t *testing.T) {
		w := testkit.NewRawServer(t, func(rw *testkit.RawServer, c net.Conn, br *bufio.Reader) {
			if _, _, err := rw.ReadRequest(br); err != nil {
				return
			}
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"+
				"Connection: X-Hop-A\r\nConnection: X-Hop-B\r\nX-Hop-A: a\r\nX-Hop-B: b\r\nX-End-To-End: kept\r\n"+
				"Content-Length: 2\r\n\r\n{}")
		})
		tp := newTestProxy(t, setup{urls: []string{w.URL}})
		status, h, body := tp.post(t, chatPath, chatBody)
		if status != http.StatusOK {
			t.Fatalf("got %d %q", status, body)
		}
		for _, name := range []string{"X-Hop-A", "X-Hop-B"} {
			if v := h.Values(name); len(v) > 0 {
				t.Errorf("the client got hop-by-hop %s: %q", name, v)
			}
		}
		if v := h.Get("X-End-To-End"); v != "kept" {
			t.Errorf("end-to-end header X-End-To-End = %q, want kept", v)
		}
	})
}

// Worker URLs may carry credentials ("http://user:password@host"); those never leave the router:
// not in answer headers, health, metrics, admin listings, error bodies or logs.
func TestSurface_WorkerCredentialsAreShownNowhere(t *testing.T) {
	const user, password = "cruser7", "crsecret9"
	withCreds := func(u string) string { return strings.Replace(u, "http://", "http://"+user+":"+password+"@", 1) }
	live := okWorker(t, "live")
	dead := closedPort(t)
	logs := &testkit.SyncBuffer{}
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	tp := newTestProxy(t, setup{urls: []string{withCreds(dead), withCreds(live.URL)}, log: log})
	deadOnly := newTestProxy(t, setup{urls: []string{withCreds(dead)}, log: log})

	var seen []string
	check := func(where, text string) {
		t.Helper()
		seen = append(seen, where)
		if strings.Contains(text, user) || strings.Contains(text, password) {
			t.Errorf("%s shows the worker's credentials: %q", where, text)
		}
	}
	headerText := func(h http.Header) string {
		var b strings.Builder
		_ = h.Write(&b)
		return b.String()
	}

	status, h, body := tp.post(t, chatPath, chatBody) // the dead worker first, then the live one
	if status != http.StatusOK {
		t.Fatalf("got %d %q", status, body)
	}
	check("answer headers", headerText(h))
	if h.Get(HeaderWorker) == "" || h.Get(HeaderBaseWorker) == "" {
		t.Errorf("the answer does not name its worker: %q", headerText(h))
	}

	status, h, body = deadOnly.post(t, chatPath, chatBody)
	if status != http.StatusBadGateway {
		t.Fatalf("dead worker only: got %d %q, want 502", status, body)
	}
	check("502 headers", headerText(h))
	check("502 body", body)

	_, _, body = tp.do(t, http.MethodGet, "/health") // loopback, no admin key: lists the workers
	if !strings.Contains(body, strings.TrimPrefix(live.URL, "http://")) {
		t.Errorf("/health does not list the worker: %q", body)
	}
	check("/health", body)
	_, _, body = tp.do(t, http.MethodGet, "/metrics")
	if !strings.Contains(body, strings.TrimPrefix(live.URL, "http://")) {
		t.Errorf("/metrics has no series of the worker: %q", body)
	}
	check("/metrics", body)
	_, _, body = tp.do(t, http.MethodGet, "/list_workers")
	check("/list_workers", body)
	_, _, body = tp.do(t, http.MethodGet, "/workers")
	check("/workers", body)
	check("logs", logs.String())
	if !strings.Contains(logs.String(), "upstream attempt failed") {
		t.Errorf("the failed attempt was not logged, so the log check proves nothing: %q", logs.String())
	}
}

var socketAddress = regexp.MustCompile(`127\.0\.0\.1:\d*`)

// assertNoSocketAddress sends one request through a router over url alone and checks the
// router's own error answer.
func assertNoSocketAddress(t *testing.T, opts Options, url string, want int) {
	t.Helper()
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{url}})
	status, _, body := tp.post(t, chatPath, chatBody)
	if status != want {
		t.Fatalf("got %d %q, want %d", status, body, want)
	}
	errorCode(t, body)
	if socketAddress.MatchString(body) {
		t.Errorf("the error names a socket address: %q", body)
	}
}

// The router's own error bodies say what happened, never which socket it happened on.
func TestSurface_BadGatewayMessagesNameNoSocketAddress(t *testing.T) {
	garbage := testkit.NewRawServer(t, func(rw *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if _, _, err := rw.ReadRequest(br); err == nil {
			_, _ = io.WriteString(c, "NOT HTTP AT ALL\r\n\r\n")
		}
	})
	closer := testkit.NewRawServer(t, func(rw *testkit.RawServer, c net.Conn, br *bufio.Reader) { _, _, _ = rw.ReadRequest(br) })
	for name, url := range map[string]string{
		"refused":                  closedPort(t),
		"closed after the request": closer.URL,
		"unreadable answer":        garbage.URL,
	} {
		t.Run(name, func(t *testing.T) { assertNoSocketAddress(t, testOptions(), url, http.StatusBadGateway) })
	}
}

// The same for the 504 of a worker that never answered within the request timeout.
func TestSurface_GatewayTimeoutMessageNamesNoSocketAddress(t *testing.T) {
	opts := testOptions()
	opts.Upstream.Timeouts.Request = 500 * time.Millisecond
	assertNoSocketAddress(t, opts, hangingWorker(t).URL, http.StatusGatewayTimeout)
}

func TestSurface_PayloadTooLargeIsAnOpenAIError(t *testing.T) {
	w := okWorker(t, "w")
	opts := testOptions()
	opts.MaxPayloadSize = 1024
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{w.URL}})

	big := `{"model":"m","messages":[{"role":"user","content":"` + strings.Repeat("x", 2048) + `"}]}`
	status, h, body := tp.post(t, chatPath, big)
	if status != http.StatusRequestEntityTooLarge {
		t.Fatalf("got %d %q, want 413", status, body)
	}
	if ct := h.Get("Content-Type"); !strings.HasPrefix(ct, "application/json") {
		t.Errorf("Content-Type %q, want JSON", ct)
	}
	if code := errorCode(t, body); code != "payload_too_large" {
		t.Errorf("error code %q, want payload_too_large", code)
	}
	if got := w.Hits.Load(); got != 0 {
		t.Errorf("the worker got %d requests, want 0", got)
	}

	// A chunked body has no length to refuse up front; it is cut at the limit all the same.
	c := tp.dial(t)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	chunk := strings.Repeat("x", 512)
	var b strings.Builder
	b.WriteString("POST " + chatPath + " HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
	for range 4 {
		b.WriteString("200\r\n" + chunk + "\r\n")
	}
	b.WriteString("0\r\n\r\n")
	_, _ = io.WriteString(c, b.String())
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("chunked body over the limit: reading the answer: %v", err)
	}
	chunked, _ := io.ReadAll(resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("chunked body over the limit: %d %q, want 413", resp.StatusCode, chunked)
	} else if code := errorCode(t, string(chunked)); code != "payload_too_large" {
		t.Errorf("chunked body over the limit: error code %q", code)
	}
	if got := w.Hits.Load(); got != 0 {
		t.Errorf("the worker got %d requests, want 0", got)
	}

	// Within the limit the same route works.
	if status, _, body := tp.post(t, chatPath, chatBody); status != http.StatusOK {
		t.Errorf("a small request after the 413: %d %q", status, body)
	}
}

func TestSurface_RequestsRefusedBeforeTheyAreReadAreCounted(t *testing.T) {
	w := okWorker(t, "w")
	opts := testOptions()
	opts.MaxPayloadSize = 1024
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{w.URL}})
	before := tp.requests("4xx")
	if status, _, body := tp.post(t, chatPath, strings.Repeat("x", 2048)); status != http.StatusRequestEntityTooLarge {
		t.Fatalf("got %d %q, want 413", status, body)
	}
	req, _ := http.NewRequest(http.MethodGet, tp.URL+chatPath, nil)
	resp, err := tp.Client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Fatalf("GET got %d, want 405", resp.StatusCode)
	}
	if got := tp.requests("4xx") - before; got != 2 {
		t.Fatalf("requests_total{status_class=4xx} rose by %v, want 2 (the 413 and the 405)", got)
	}
}
