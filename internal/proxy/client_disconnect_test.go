package proxy

import (
	"bufio"
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

// A client that goes away must stop the work done for it: the worker's request is cancelled (vLLM
// stops generating for a request whose connection closed), the worker's load is given back, and
// nothing more is sent anywhere. It is no verdict on the worker: its breaker does not count it
// (the breakers here open on a single failure, so "still closed" proves it).

// totalUpstreamErrors sums upstream_errors_total over every kind.
func (tp *testProxy) totalUpstreamErrors() float64 {
	n := 0.0
	for _, kind := range []string{upstream.KindConnect, upstream.KindReset, upstream.KindFirstByte, upstream.KindTimeout,
		upstream.KindStatus, upstream.KindSent, upstream.KindMidStream, upstream.KindBadReply} {
		n += tp.upstreamErrors(kind)
	}
	return n
}

// Mid-stream, the router learns that the client left either from a failed write (the worker
// keeps sending) or from its client watch (the worker is quiet: a long pause between tokens, a
// tool call being prepared). Both end the same way.
func TestClientDisconnect_MidStreamCancelsTheWorkersRequest(t *testing.T) {
	for _, tc := range []struct {
		name  string
		every time.Duration // between events after the first; 0: no more events
	}{
		{"worker keeps streaming", 50 * time.Millisecond},
		{"worker pauses after the first event", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cancelled := newSignal()
			w := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "text/event-stream")
				var tick <-chan time.Time
				if tc.every > 0 {
					ticker := time.NewTicker(tc.every)
					defer ticker.Stop()
					tick = ticker.C
				}
				limit := time.After(20 * time.Second)
				for {
					_, _ = io.WriteString(w, "data: {\"token\":\"t\"}\n\n")
					w.(http.Flusher).Flush()
					select {
					case <-r.Context().Done():
						cancelled.fire()
						return
					case <-limit:
						return
					case <-tick:
					}
				}
			})
			tp := newTestProxy(t, setup{urls: []string{w.URL}, pool: oneFailureBreaker})
			worker := tp.worker(t, w.URL)

			c := tp.dial(t)
			if _, err := io.WriteString(c, rawRequest(http.MethodPost, chatPath, streamBody)); err != nil {
				t.Fatal(err)
			}
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			br := bufio.NewReader(c)
			for { // read until the first event arrived
				line, err := br.ReadString('\n')
				if err != nil {
					t.Fatalf("reading the stream: %v", err)
				}
				if strings.HasPrefix(line, "data: ") {
					break
				}
			}
			_ = c.Close()

			cancelled.wait(t, 5*time.Second, "the worker's request context is cancelled")
			tp.loadReturnsToZero(t)
			testkit.WaitWithin(t, 5*time.Second, "requests_total{status_class=4xx} is 1 (499, client gone)", func() bool {
				return tp.requests("4xx") == 1
			})
			if got := tp.requests(metrics.StatusCut); got != 0 {
				t.Errorf("requests_total{status_class=cut} = %v: the client left, the worker did not break off", got)
			}
			tp.wantUpstreamErrors(t, upstream.KindMidStream, 0)
			if st := worker.Breaker().State(); st != workers.BreakerClosed {
				t.Errorf("breaker %v after a client left, want closed", st)
			}
		})
	}
}

// A non-streamed answer comes whole at the end of the generation, so the router would notice a
// departed client only then; its client watch notices within a few of its 250 ms rounds instead,
// and closes the worker connection.
func TestClientDisconnect_WhileWaitingOnANonStreamedAnswer(t *testing.T) {
	started, cancelled := newSignal(), newSignal()
	w := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		started.fire()
		select {
		case <-r.Context().Done():
			cancelled.fire()
		case <-time.After(20 * time.Second):
			w.WriteHeader(http.StatusOK)
		}
	})
	tp := newTestProxy(t, setup{urls: []string{w.URL}, pool: oneFailureBreaker})
	worker := tp.worker(t, w.URL)

	c := tp.dial(t)
	if _, err := io.WriteString(c, rawRequest(http.MethodPost, chatPath, chatBody)); err != nil {
		t.Fatal(err)
	}
	started.wait(t, 5*time.Second, "the worker received the request")
	_ = c.Close()

	cancelled.wait(t, 5*time.Second, "the worker's request context is cancelled")
	tp.loadReturnsToZero(t)
	testkit.WaitWithin(t, 5*time.Second, "requests_total{status_class=4xx} is 1 (499, client gone)", func() bool {
		return tp.requests("4xx") == 1
	})
	if got := tp.totalUpstreamErrors(); got != 0 {
		t.Errorf("upstream_errors_total = %v over all kinds, want 0: the worker did nothing wrong", got)
	}
	if st := worker.Breaker().State(); st != workers.BreakerClosed {
		t.Errorf("breaker %v after a client left, want closed", st)
	}
}

// A client that leaves while the router waits to retry is not retried for: the next worker never
// hears of the request, not even as a new connection.
func TestClientDisconnect_DuringBackoffStopsTheRetry(t *testing.T) {
	answered := newSignal()
	busy := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.WriteHeader(http.StatusServiceUnavailable)
		answered.fire()
	})
	next := testkit.NewRawServer(t, func(rw *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if _, _, err := rw.ReadRequest(br); err == nil {
			_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
		}
	})
	opts := testOptions()
	opts.InitialBackoff = 2 * time.Second // jittered to [1 s, 2 s]
	opts.MaxBackoff = 2 * time.Second
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{busy.URL, next.URL}})

	c := tp.dial(t)
	if _, err := io.WriteString(c, rawRequest(http.MethodPost, chatPath, chatBody)); err != nil {
		t.Fatal(err)
	}
	answered.wait(t, 5*time.Second, "the first worker answered 503")
	_ = c.Close()

	testkit.WaitWithin(t, 8*time.Second, "requests_total{status_class=4xx} is 1 (499, client gone)", func() bool {
		return tp.requests("4xx") == 1
	})
	// The worker accepts in dial order, so once it has accepted a connection dialed now, it has
	// accepted any the router dialed before: the probe must be the only one.
	probe, err := net.Dial("tcp", strings.TrimPrefix(next.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer probe.Close()
	testkit.WaitWithin(t, 5*time.Second, "the next worker accepted the probe", func() bool { return next.Conns.Load() >= 1 })
	if got := next.Conns.Load() - 1; got != 0 {
		t.Errorf("the next worker got %d connections (%d requests) after the client left, want none",
			got, next.Requests.Load())
	}
	tp.loadReturnsToZero(t)
}

// The watch must leave a client that is still there alone: a request that outlasts several watch
// rounds is answered in full, and the worker's request is not cancelled.
func TestClientDisconnect_ClientThatStaysIsNotCutByTheWatch(t *testing.T) {
	cancelled := newSignal()
	w := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
			cancelled.fire()
			return
		case <-time.After(4 * clientWatchInterval):
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"done":true}`)
	})
	tp := newTestProxy(t, setup{urls: []string{w.URL}, pool: oneFailureBreaker})

	status, _, body := tp.post(t, chatPath, chatBody)
	if status != http.StatusOK || body != `{"done":true}` {
		t.Fatalf("got %d %q, want the worker's whole answer", status, body)
	}
	select {
	case <-cancelled.ch:
		t.Error("the worker's request was cancelled while the client waited")
	default:
	}
	testkit.WaitWithin(t, 5*time.Second, "requests_total{status_class=2xx} is 1", func() bool { return tp.requests("2xx") == 1 })
	tp.loadReturnsToZero(t)
}
