package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/upstream"
)

// Every timeout of the router, each cut short so that the behaviour shows within a test. The
// bounds the tests wait with are upper bounds on behaviour ("closed within 5 s" when the timeout
// is 1 s); none of them is a performance target.

// A streamed request whose worker sends no response header before the first-byte deadline is
// answered 504 then; the worker, silent for as long, is out of rotation at once, and the next
// request goes to another worker.
func TestTimeouts_FirstByteDeadlineIs504AndTheSilentWorkerTakesNoNextRequest(t *testing.T) {
	hang := hangingWorker(t)
	live := sseWorker(t, "live", 3)
	opts := testOptions()
	opts.Upstream.Timeouts.FirstByte = 100 * time.Millisecond
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{hang.URL, live.URL}})

	status, _, body := tp.post(t, chatPath, streamBody)
	wantErrorAnswer(t, status, body, http.StatusGatewayTimeout, "upstream_timeout")
	tp.wantUpstreamErrors(t, upstream.KindFirstByte, 1)
	for range 3 {
		status, h, body := tp.post(t, chatPath, streamBody)
		if status != http.StatusOK || !strings.Contains(body, `"live"`) || !strings.Contains(body, "[DONE]") {
			t.Fatalf("next request: %d %q, want the live worker's whole stream", status, body)
		}
		if got := h.Get(HeaderWorker); got != tp.worker(t, live.URL).Name() {
			t.Errorf("%s = %q, want the live worker", HeaderWorker, got)
		}
	}
	if got := hang.Requests.Load(); got != 1 {
		t.Errorf("the hanging worker read %d requests, want 1", got)
	}
	tp.loadReturnsToZero(t)
}

// A non-streamed answer's headers come with the finished generation; the first-byte deadline
// bounds them all the same, so a fleet of hung workers answers a non-streamed request at that
// deadline: 504, after one attempt, instead of each worker in turn waiting out a stall check.
func TestTimeouts_NonStreamedRequestToHungWorkersEndsAtTheFirstByteDeadline(t *testing.T) {
	var urls []string
	var hung []*testkit.RawServer
	for range 4 {
		h := hangingWorker(t)
		hung = append(hung, h)
		urls = append(urls, h.URL)
	}
	opts := testOptions()
	opts.Upstream.Timeouts.Request = time.Minute // far beyond the bound waited on here
	opts.MaxRetries = 3
	opts.Upstream.Timeouts.FirstByte = 200 * time.Millisecond
	tp := newTestProxy(t, setup{opts: &opts, urls: urls})
	tp.Client.Timeout = 15 * time.Second // an upper bound on behaviour, far above the deadline

	for _, body := range []string{chatBody, streamBody} {
		status, _, got := tp.post(t, chatPath, body)
		if status != http.StatusGatewayTimeout || errorCode(t, got) != "upstream_timeout" {
			t.Fatalf("%s: got %d %q, want 504 upstream_timeout", body, status, got)
		}
	}
	var asked int64
	for _, h := range hung {
		asked += h.Requests.Load()
	}
	if asked != 2 {
		t.Errorf("the hung workers read %d requests, want 2: one attempt per request, all attempts within one deadline", asked)
	}
	tp.loadReturnsToZero(t)
}

// Without a first-byte deadline, the request timeout bounds the wait; a request that ran out of
// it may have generated: 504, not retried.
func TestTimeouts_RequestTimeoutIs504AndNotRetried(t *testing.T) {
	hang := hangingWorker(t)
	live := okWorker(t, "live")
	opts := testOptions()
	opts.Upstream.Timeouts.Request = time.Second
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{hang.URL, live.URL}})

	status, _, body := tp.post(t, chatPath, chatBody)
	wantErrorAnswer(t, status, body, http.StatusGatewayTimeout, "upstream_timeout")
	if got := live.Hits.Load(); got != 0 {
		t.Errorf("the other worker got %d requests, want 0 (not retried)", got)
	}
	tp.wantUpstreamErrors(t, upstream.KindTimeout, 1)
	tp.wantUpstreamErrors(t, upstream.KindFirstByte, 0, ": no first-byte deadline")
	tp.loadReturnsToZero(t)
}

// A client that trickles its body (one byte every 250 ms: each read alone is quick) is cut once
// the whole body has taken longer than the client body timeout; the worker never sees it.
func TestTimeouts_SlowBodyIsCutAfterClientBodyTimeout(t *testing.T) {
	live := okWorker(t, "live")
	opts := testOptions()
	opts.ClientBodyTimeout = time.Second
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{live.URL}})

	c := tp.dial(t)
	if _, err := io.WriteString(c, "POST "+chatPath+" HTTP/1.1\r\nHost: router\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	testkit.Go(t, func() { close(stop) }, func() error { // 40 bytes at most: the body would need 250 s
		for range 40 {
			select {
			case <-stop:
				return nil
			case <-time.After(250 * time.Millisecond):
			}
			if _, err := c.Write([]byte("x")); err != nil {
				return nil
			}
		}
		return nil
	})
	got := waitClosed(t, c, 8*time.Second)
	if len(got) > 0 && !bytes.HasPrefix(got, []byte("HTTP/1.1 408 ")) {
		t.Errorf("answer before the close: %q, want 408 or nothing", got)
	}
	if n := live.Hits.Load(); n != 0 {
		t.Errorf("the worker got %d requests, want 0", n)
	}
}

// A connection that sends nothing, or stops in the middle of its headers, is closed after the
// client header timeout.
func TestTimeouts_SilentConnectionIsClosedAfterClientHeaderTimeout(t *testing.T) {
	opts := testOptions()
	opts.ClientHeaderTimeout = 500 * time.Millisecond
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{okWorker(t, "live").URL}})

	t.Run("nothing sent", func(t *testing.T) {
		waitClosed(t, tp.dial(t), 5*time.Second)
	})
	t.Run("headers unfinished", func(t *testing.T) {
		c := tp.dial(t)
		if _, err := io.WriteString(c, "POST "+chatPath+" HTTP/1.1\r\nHost: router\r\n"); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, c, 5*time.Second)
	})
}

// An idle keep-alive connection is closed after the keep-alive timeout, which is independent of
// the (here much longer) header timeout.
func TestTimeouts_IdleKeepAliveConnectionIsClosedAfterKeepaliveTimeout(t *testing.T) {
	opts := testOptions()
	opts.KeepaliveTimeout = 500 * time.Millisecond
	opts.ClientHeaderTimeout = 30 * time.Second
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{okWorker(t, "live").URL}})

	c := tp.dial(t)
	if status := roundTrip(t, c, rawRequest(http.MethodGet, "/liveness", "")); status != http.StatusOK {
		t.Fatalf("/liveness: %d", status)
	}
	if got := waitClosed(t, c, 5*time.Second); len(got) != 0 {
		t.Errorf("unexpected bytes on the idle connection: %q", got)
	}
}

// Connections above MaxClientConns are refused with 503 at once; the ones within the cap keep
// working, and a slot freed by a closed connection serves a new one.
func TestTimeouts_MaxClientConnsRefusesConnectionsAboveTheCap(t *testing.T) {
	opts := testOptions()
	opts.MaxClientConns = 2
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{okWorker(t, "live").URL}})

	within := []net.Conn{tp.dial(t), tp.dial(t)}
	for i, c := range within {
		if status := roundTrip(t, c, rawRequest(http.MethodGet, "/liveness", "")); status != http.StatusOK {
			t.Fatalf("connection %d within the cap: %d", i, status)
		}
	}

	over := tp.dial(t)
	got := waitClosed(t, over, 5*time.Second) // the refusal is written on accept, unasked
	if !bytes.HasPrefix(got, []byte("HTTP/1.1 503 ")) {
		t.Fatalf("connection above the cap got %q, want a 503 answer", got)
	}

	for i, c := range within {
		if status := roundTrip(t, c, rawRequest(http.MethodPost, chatPath, chatBody)); status != http.StatusOK {
			t.Errorf("connection %d within the cap after the refusal: %d", i, status)
		}
	}

	_ = within[0].Close()
	served := false
	for range 50 { // the slot frees once the router has seen the close
		c, err := net.DialTimeout("tcp", tp.Addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, rawRequest(http.MethodGet, "/liveness", ""))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		_ = c.Close()
		if err == nil && resp.StatusCode == http.StatusOK {
			served = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !served {
		t.Error("a new connection was never served after one within the cap closed")
	}
}

// floodStream answers r with 32 KiB stream events as fast as they are taken, until the write
// fails, the request ends or limit has passed.
func floodStream(w http.ResponseWriter, r *http.Request, limit time.Duration) {
	w.Header().Set("Content-Type", "text/event-stream")
	chunk := []byte("data: " + strings.Repeat("x", 32<<10) + "\n\n")
	stop := time.After(limit)
	for {
		if _, err := w.Write(chunk); err != nil {
			return
		}
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			return
		case <-stop:
			return
		default:
		}
	}
}

// A streaming client that never reads its answer cannot hold the worker's load past the request
// timeout: the lease is given back whatever the client does, and the worker connection closes.
func TestTimeouts_StreamingClientThatNeverReadsReleasesTheLoad(t *testing.T) {
	stopped := newSignal()
	flood := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		defer stopped.fire()
		_, _ = io.Copy(io.Discard, r.Body)
		floodStream(w, r, 20*time.Second)
	})
	opts := testOptions()
	opts.Upstream.Timeouts.Request = time.Second
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{flood.URL}})
	w := tp.worker(t, flood.URL)

	tp.streamToANonReader(t)
	testkit.WaitWithin(t, 5*time.Second, "the worker is streaming", func() bool { return flood.Hits.Load() == 1 })

	testkit.WaitWithin(t, 8*time.Second, "load back to 0 with a client that never reads", func() bool { return w.Load() == 0 })
	stopped.wait(t, 8*time.Second, "the worker is told to stop streaming")
	testkit.WaitWithin(t, 5*time.Second, "the request counted once", func() bool {
		n := 0.0
		for _, class := range []string{"2xx", "4xx", "5xx", metrics.StatusCut} {
			n += tp.requests(class)
		}
		return n == 1
	})
	if got := tp.requests("2xx"); got != 0 {
		t.Errorf("requests_total{status_class=2xx} = %v: an answer the client never took is not a success", got)
	}
}

// A client that stops reading its answer is cut once it has accepted no byte for the client
// write timeout, long before the request timeout: its worker's request is aborted (the worker
// connection closes), the worker's load and the client's admission slot are given back, and the
// answer counts as cut.
func TestTimeouts_ClientThatStopsReadingIsCutAfterClientWriteTimeout(t *testing.T) {
	stopped := newSignal()
	flood := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if !strings.Contains(string(body), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"ok":true}`)
			return
		}
		defer stopped.fire()
		floodStream(w, r, 30*time.Second)
	})
	ctrl, err := admission.New(admission.Options{MaxInFlight: 1, QueueSize: 4})
	if err != nil {
		t.Fatal(err)
	}
	opts := testOptions()
	opts.Upstream.Timeouts.Request = time.Minute // far beyond the bounds waited on here
	opts.ClientWriteTimeout = time.Second
	opts.Admission = &Admission{Controller: ctrl}
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{flood.URL}})
	w := tp.worker(t, flood.URL)

	c := tp.streamToANonReader(t)
	testkit.WaitWithin(t, 5*time.Second, "the worker is streaming", func() bool { return flood.Hits.Load() == 1 })

	stopped.wait(t, 10*time.Second, "the worker's request is aborted")
	testkit.WaitWithin(t, 5*time.Second, "the worker's load is given back", func() bool { return w.Load() == 0 })
	testkit.WaitWithin(t, 5*time.Second, "the admission slot is given back", func() bool { return ctrl.InFlight() == 0 })
	testkit.WaitWithin(t, 5*time.Second, "the answer counts as cut", func() bool { return tp.requests(metrics.StatusCut) == 1 })
	waitClosed(t, c, 10*time.Second) // what the kernel had buffered, then the close

	// The slot serves the next client (a non-streamed request: a short answer).
	if status, _, body := tp.post(t, chatPath, chatBody); status != http.StatusOK {
		t.Errorf("next request: %d %q, want 200", status, body)
	}
}

// slowHeadersWorker reads each request and starts its answer's headers, then sends no more of
// them; the connection stays open until the router closes it (or the test ends).
func slowHeadersWorker(t *testing.T) *testkit.RawServer {
	return testkit.NewRawServer(t, func(rw *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if _, _, err := rw.ReadRequest(br); err != nil {
			return
		}
		_, _ = io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n")
		_, _ = io.Copy(io.Discard, br)
	})
}

// A worker that starts its headers but does not finish them before the first-byte deadline sent
// the client nothing: 504 as when no byte came at all, not a bad answer.
func TestTimeouts_SlowHeadersAreAFirstByteTimeout(t *testing.T) {
	slow := slowHeadersWorker(t)
	opts := testOptions()
	opts.Upstream.Timeouts.FirstByte = 100 * time.Millisecond
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{slow.URL}})

	status, _, body := tp.post(t, chatPath, streamBody)
	wantErrorAnswer(t, status, body, http.StatusGatewayTimeout, "upstream_timeout")
	tp.wantUpstreamErrors(t, upstream.KindFirstByte, 1)
	tp.wantUpstreamErrors(t, upstream.KindBadReply, 0)
	tp.loadReturnsToZero(t)
}

// Attempts share the first-byte deadline: after a worker answered 503 at once, the next attempt
// waits only for what is left of it.
func TestTimeouts_ARetryWaitsWithinTheFirstAttemptsFirstByteDeadline(t *testing.T) {
	busy := testkit.NamedServer(t, http.StatusServiceUnavailable, "busy")
	slow := slowHeadersWorker(t)
	opts := testOptions()
	opts.Upstream.Timeouts.FirstByte = 200 * time.Millisecond
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{busy.URL, slow.URL}})
	tp.Client.Timeout = 15 * time.Second

	status, _, body := tp.post(t, chatPath, chatBody)
	wantErrorAnswer(t, status, body, http.StatusGatewayTimeout, "upstream_timeout")
	if busy.Hits.Load() != 1 || slow.Requests.Load() != 1 {
		t.Errorf("the workers got %d and %d requests, want one each", busy.Hits.Load(), slow.Requests.Load())
	}
	tp.wantUpstreamErrors(t, upstream.KindFirstByte, 1)
	tp.loadReturnsToZero(t)
}
