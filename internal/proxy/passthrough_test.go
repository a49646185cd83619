package proxy

import (
	"bufio"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// A path the router neither routes nor serves itself (vLLM's /version, /ping, /invocations, a
// path vLLM adds later) reaches a worker as it came, whatever its method, body and query, and is
// counted under one label, never its own path.
func TestUnknownPathsAreForwardedToAWorker(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{"worker":"w"}`)
	tp := newTestProxy(t, setup{urls: []string{w.URL}})
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodGet, "/version", ""},
		{http.MethodGet, "/ping", ""},
		{http.MethodPost, "/ping", ""},
		{http.MethodPost, "/invocations", `{"model":"m","prompt":"hi"}`},
		{http.MethodPost, "/v2/rerank", `{"model":"m","query":"q","documents":["a"]}`},
		{http.MethodPut, "/a/path/of/next/year?x=1", "not json"},
		{http.MethodDelete, "/v1/files/f-1", ""},
	} {
		req, _ := http.NewRequest(tc.method, tp.URL+tc.path, strings.NewReader(tc.body))
		resp, err := tp.Client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || string(body) != `{"worker":"w"}` {
			t.Fatalf("%s %s: %d %q, want the worker's answer", tc.method, tc.path, resp.StatusCode, body)
		}
		if resp.Header.Get(HeaderWorker) == "" {
			t.Errorf("%s %s: no %s header", tc.method, tc.path, HeaderWorker)
		}
		got := w.lines()
		if last := got[len(got)-1]; last != tc.method+" "+tc.path+" "+tc.body {
			t.Errorf("the worker got %q, want %q", last, tc.method+" "+tc.path+" "+tc.body)
		}
	}
	if n := testutil.ToFloat64(tp.Metrics.Requests.WithLabelValues(passThroughPattern, "2xx")); n != 7 {
		t.Errorf("requests_total{route=%q,2xx} = %v, want 7", passThroughPattern, n)
	}
	if text := metricText(t, tp); strings.Contains(text, "/version") || strings.Contains(text, "/ping") {
		t.Error("a forwarded path became a metrics label")
	}
}

// A HEAD to a forwarded path gets the worker's status and headers and no body, and the
// connection serves the next request.
func TestHEADToAnUnknownPathIsForwardedWithoutABody(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{"worker":"w"}`)
	tp := newTestProxy(t, setup{urls: []string{w.URL}})
	c := tp.dial(t)
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for _, method := range []string{http.MethodHead, http.MethodHead, http.MethodGet} {
		if _, err := io.WriteString(c, rawRequest(method, "/version", "")); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, &http.Request{Method: method})
		if err != nil {
			t.Fatalf("%s /version: %v", method, err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || (method == http.MethodHead) != (len(body) == 0) {
			t.Fatalf("%s /version: %d, %d body bytes, %v", method, resp.StatusCode, len(body), err)
		}
	}
	if got := w.lines(); len(got) != 3 || got[0] != "HEAD /version " {
		t.Fatalf("the worker got %q", got)
	}
}

// The router's own paths stay its own: health, models, metrics, the admin API and the root are
// answered by the router and never reach a worker, whatever the method.
func TestTheRoutersOwnPathsAreNotForwarded(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{"worker":"w"}`)
	tp := newTestProxy(t, setup{urls: []string{w.URL}})
	for _, tc := range []struct {
		method, path string
		status       int
	}{
		{http.MethodGet, "/health", http.StatusOK},
		{http.MethodGet, "/v1/models", http.StatusOK},
		{http.MethodGet, "/metrics", http.StatusOK},
		{http.MethodGet, "/workers", http.StatusOK},
		{http.MethodGet, "/workers/http%3A%2F%2Fnowhere", http.StatusNotFound},
		{http.MethodDelete, "/health", http.StatusMethodNotAllowed},
		{http.MethodPost, "/", http.StatusMethodNotAllowed},
		{http.MethodGet, "/", http.StatusOK},
	} {
		if status, _, body := tp.do(t, tc.method, tc.path); status != tc.status {
			t.Errorf("%s %s: %d %s, want %d", tc.method, tc.path, status, body, tc.status)
		}
	}
	if got := w.lines(); len(got) != 0 {
		t.Fatalf("the worker got %q", got)
	}
}

// Clients check a base URL with HEAD / (Claude Code at every start): 200 with no body, as GET /
// answers 200, by the router itself.
func TestHEADAndGETOfTheRootAnswer200(t *testing.T) {
	tp := newTestProxy(t, setup{urls: []string{closedPort(t)}})
	resp, err := tp.Client.Head(tp.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || len(body) != 0 {
		t.Fatalf("HEAD /: %d with %d body bytes, want 200 and none", resp.StatusCode, len(body))
	}
	status, _, got := tp.do(t, http.MethodGet, "/")
	if status != http.StatusOK || !strings.Contains(got, "cacheroute") {
		t.Fatalf("GET /: %d %s", status, got)
	}
}

// With RefuseUnknownPaths an unknown path is answered 404 with the routed paths, and no worker
// is asked.
func TestUnknownPathListsTheRoutedPathsWhenRefused(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{"worker":"w"}`)
	opts := testOptions()
	opts.RefuseUnknownPaths = true
	tp := newTestProxy(t, setup{urls: []string{w.URL}, opts: &opts})
	status, _, body := tp.post(t, "/v1/nothing", `{}`)
	if status != http.StatusNotFound || !strings.Contains(body, "/v1/responses") || !strings.Contains(body, "/v1/messages") {
		t.Fatalf("%d %s", status, body)
	}
	if got := w.lines(); len(got) != 0 {
		t.Fatalf("the worker got %q", got)
	}
}

// metricText is the router's /metrics as an admin on loopback reads it.
func metricText(t *testing.T, tp *testProxy) string {
	t.Helper()
	status, _, body := tp.do(t, http.MethodGet, "/metrics")
	if status != http.StatusOK {
		t.Fatalf("GET /metrics: %d", status)
	}
	return body
}

// A forwarded path is closed by client keys as the routed ones are: 401 without a valid key, no
// worker asked; with one, forwarded without the client's key.
func TestForwardedPathsTakeClientKeys(t *testing.T) {
	tp, w := keyedProxy(t, false)
	if status, _, body := tp.do(t, http.MethodGet, "/version"); status != http.StatusUnauthorized || errorCode(t, body) != "invalid_api_key" {
		t.Fatalf("GET /version without a key: %d %s, want 401 invalid_api_key", status, body)
	}
	if w.Hits.Load() != 0 {
		t.Fatalf("the worker was asked %d times", w.Hits.Load())
	}
	if status, _, _ := tp.do(t, http.MethodGet, "/version", "Authorization", "Bearer sk-alice"); status != http.StatusOK {
		t.Fatalf("GET /version with a key: %d", status)
	}
	if auth := w.headerValues("Authorization"); len(auth) != 1 || auth[0] != "Bearer worker-key" {
		t.Fatalf("the worker got Authorization %q, want the worker key", auth)
	}
}
