package proxy

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// An answer that breaks off after it started cannot be retried (the client already has part of
// it), and it must not look complete either: the client's connection is cut so that its HTTP
// library reports an error instead of a clean, short answer. The request counts as "cut", the
// worker's failure reaches its breaker, and its load is given back.

// readAll sends body to path and reads the whole answer; err is the error of the request or of
// reading its body.
func (tp *testProxy) readAll(t *testing.T, body string) (status int, got string, err error) {
	t.Helper()
	resp, err := tp.Client.Post(tp.URL+chatPath, "application/json", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

func TestTruncatedResponse_StreamBrokenByTheWorkerReachesTheClientTruncated(t *testing.T) {
	w := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		for i := range 3 {
			_, _ = fmt.Fprintf(w, "data: {\"i\":%d}\n\n", i)
			w.(http.Flusher).Flush()
		}
		// Break the chunked stream off: no final chunk, the connection just closes.
		c, _, err := w.(http.Hijacker).Hijack()
		if err == nil {
			_ = c.Close()
		}
	})
	tp := newTestProxy(t, setup{urls: []string{w.URL}, pool: oneFailureBreaker})
	worker := tp.worker(t, w.URL)

	status, body, err := tp.readAll(t, streamBody)
	if status != http.StatusOK {
		t.Fatalf("status %d, want the worker's 200", status)
	}
	if err == nil {
		t.Fatalf("the client read a clean end of a broken stream: %q", body)
	}
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Logf("client error %v (not io.ErrUnexpectedEOF, still an error)", err)
	}
	for i := range 3 {
		if ev := fmt.Sprintf(`data: {"i":%d}`, i); !strings.Contains(body, ev) {
			t.Errorf("event %q sent before the break did not reach the client; got %q", ev, body)
		}
	}
	testkit.WaitWithin(t, 5*time.Second, "requests_total{status_class=cut} is 1", func() bool {
		return tp.requests(metrics.StatusCut) == 1
	})
	if got := tp.requests("2xx"); got != 0 {
		t.Errorf("requests_total{status_class=2xx} = %v, want 0", got)
	}
	tp.wantUpstreamErrors(t, upstream.KindMidStream, 1)
	if st := worker.Breaker().State(); st != workers.BreakerOpen {
		t.Errorf("breaker %v, want open: the worker's break-off is a failure (threshold 1)", st)
	}
	tp.loadReturnsToZero(t)
}

// shortWorker announces a Content-Length of announced bytes, sends sent of them, and closes.
func shortWorker(t *testing.T, announced, sent int) *testkit.RawServer {
	return testkit.NewRawServer(t, func(rw *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if _, _, err := rw.ReadRequest(br); err != nil {
			return
		}
		_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", announced)
		_, _ = io.WriteString(c, strings.Repeat("a", sent))
	})
}

func TestTruncatedResponse_ContentLengthLongerThanTheBodyIsAnError(t *testing.T) {
	cases := []struct {
		name            string
		body            string
		announced, sent int
	}{
		{"non-streamed, larger than the buffered size", chatBody, 2 << 20, 1 << 20},
		{"streamed request", streamBody, 100, 40},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			w := shortWorker(t, tc.announced, tc.sent)
			tp := newTestProxy(t, setup{urls: []string{w.URL}, pool: oneFailureBreaker})

			status, body, err := tp.readAll(t, tc.body)
			if err == nil {
				t.Fatalf("clean answer %d with %d of %d bytes: a short body looks complete", status, len(body), tc.announced)
			}
			if len(body) > tc.sent {
				t.Errorf("got %d bytes, more than the %d the worker sent", len(body), tc.sent)
			}
			breaker := tp.worker(t, w.URL).Breaker()
			testkit.WaitWithin(t, 5*time.Second, "the breaker opens: the worker broke its answer off (threshold 1)", func() bool {
				return breaker.State() == workers.BreakerOpen
			})
			tp.loadReturnsToZero(t)
		})
	}
}

// A non-streamed answer of modest size is read whole before anything is sent, so when the
// worker breaks it off the client has received nothing yet: it gets a clear 502 in its route's
// shape rather than an empty reply or a short body. Nothing is retried (the worker generated it);
// the failure is the worker's.
func TestTruncatedResponse_SmallNonStreamedAnswerCutByTheWorkerIs502(t *testing.T) {
	for _, tc := range []struct {
		name, path, body string
	}{
		{"chat completions", chatPath, chatBody},
		{"messages", "/v1/messages", `{"model":"m","max_tokens":8,"messages":[{"role":"user","content":"hi"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := shortWorker(t, 100, 40)
			other := okWorker(t, "other")
			tp := newTestProxy(t, setup{urls: []string{w.URL, other.URL}, pool: oneFailureBreaker})

			status, h, body := tp.post(t, tc.path, tc.body)
			if status != http.StatusBadGateway {
				t.Fatalf("got %d %q, want 502", status, body)
			}
			if tc.path == chatPath {
				if code := errorCode(t, body); code != "upstream_unavailable" {
					t.Errorf("error code %q, want upstream_unavailable", code)
				}
			} else if typ := anthropicErrorType(t, body); typ != "api_error" {
				t.Errorf("error type %q, want api_error", typ)
			}
			if got := h.Get(HeaderWorker); got != "" {
				t.Errorf("%s = %q on the router's own answer", HeaderWorker, got)
			}
			if got := other.Hits.Load(); got != 0 {
				t.Errorf("the other worker got %d requests: a generated answer is not retried", got)
			}
			tp.wantUpstreamErrors(t, upstream.KindMidStream, 1)
			testkit.WaitWithin(t, 5*time.Second, "the breaker opens: the worker broke its answer off (threshold 1)", func() bool {
				return tp.worker(t, w.URL).Breaker().State() == workers.BreakerOpen
			})
			tp.loadReturnsToZero(t)
		})
	}
}
