package upstream

import (
	"bufio"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

const okAnswer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"

// peer is a Peer whose stall verdict a test sets.
type peer struct {
	stalled  atomic.Bool
	progress atomic.Int32
}

func (p *peer) Progressed()   { p.progress.Add(1) }
func (p *peer) Stalled() bool { return p.stalled.Load() }

func testPools(resent func(Failure)) *Pools {
	return NewPools(PoolOptions{Dialer: Dialer{Timeouts: Timeouts{Dial: 2 * time.Second, Idle: time.Minute}}, MaxIdlePerWorker: 4, Resent: resent})
}

func newCall(p Peer) *Call {
	deadline := time.Now().Add(10 * time.Second)
	return &Call{Peer: p, Deadline: deadline, HeadersBy: deadline, CheckStall: true}
}

func modelsRequest(url string) *fasthttp.Request {
	out := fasthttp.AcquireRequest()
	out.SetRequestURI(url + "/v1/models")
	return out
}

// sendWhole sends call i of a test to the worker at url through pool, reads its answer whole and
// finishes the call; it returns the call's connection and whether it went back to the pool.
func sendWhole(t *testing.T, pool *Pool, url string, i int) (*Conn, bool) {
	t.Helper()
	call := newCall(&peer{})
	resp, c, f := pool.Send(modelsRequest(url), call)
	if resp == nil {
		t.Fatalf("call %d failed: %+v", i, f)
	}
	_, _ = io.ReadAll(resp.BodyStream())
	return c, call.Finish(c, resp, true)
}

// An answer read to its end leaves its connection for the next call: two calls, one connection.
// The worker's bytes are its progress.
func TestPool_ConnectionOfAWholeAnswerIsReused(t *testing.T) {
	w := testkit.NewRawServer(t, func(w *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		for w.Read(br) {
			_, _ = io.WriteString(c, okAnswer)
		}
	})
	pool, err := testPools(nil).Pool(w.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{}
	for range 2 {
		call := newCall(p)
		resp, c, f := pool.Send(modelsRequest(w.URL), call)
		if resp == nil {
			t.Fatalf("failed: %+v", f)
		}
		if _, err := io.ReadAll(resp.BodyStream()); err != nil {
			t.Fatal(err)
		}
		if !call.Finish(c, resp, true) {
			t.Fatal("a connection whose answer was read whole did not go back to the pool")
		}
	}
	if n := w.Conns.Load(); n != 1 {
		t.Errorf("%d connections for two calls, want 1", n)
	}
	if p.progress.Load() == 0 {
		t.Error("the answer's bytes were not the worker's progress")
	}
}

// A worker whose close crosses the next request on the wire (it answers, then closes as the next
// request arrives, without reading it) leaves a dead connection in the pool that no check before
// reuse can see. The call that takes it is sent again at once on a new connection, which Resent
// is told of, and the worker reads each request once.
func TestPool_StaleConnectionIsResentOnANewOne(t *testing.T) {
	w := testkit.NewRawServer(t, func(w *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if w.Read(br) {
			_, _ = io.WriteString(c, okAnswer)
			_, _ = br.Peek(1) // the next request has arrived: close without reading it
		}
	})
	var resent []Failure
	pool, err := testPools(func(f Failure) { resent = append(resent, f) }).Pool(w.URL)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		sendWhole(t, pool, w.URL, i)
	}
	if n := w.Requests.Load(); n != 2 {
		t.Errorf("the worker read %d requests, want 2", n)
	}
	if len(resent) != 1 || resent[0].Kind != KindReset || !resent[0].Retryable {
		t.Errorf("re-sends told %+v, want one retryable reset", resent)
	}
	if n := w.Conns.Load(); n != 2 {
		t.Errorf("%d connections, want 2: the pooled one and the new one", n)
	}
}

// A worker that closes a connection while it sits idle in the pool (its keep-alive timeout) is
// seen to have closed it before reuse, once the connection has been idle for closeCheckAfter: the
// next call goes out on a new connection at once, not sent on the dead one and then again.
func TestPool_ConnectionTheWorkerClosedWhileIdleIsNotReused(t *testing.T) {
	w := testkit.NewRawServer(t, func(w *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if w.Read(br) {
			_, _ = io.WriteString(c, okAnswer) // then close, as at a keep-alive timeout
		}
	})
	var resent []Failure
	pool, err := testPools(func(f Failure) { resent = append(resent, f) }).Pool(w.URL)
	if err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		c, pooled := sendWhole(t, pool, w.URL, i)
		if !pooled {
			t.Fatalf("call %d: its connection did not go back to the pool", i)
		}
		testkit.WaitFor(t, "the worker's close to arrive", func() bool { return PeerClosed(c.raw) })
		pool.mu.Lock()
		pool.idle[0].idleSince = time.Now().Add(-closeCheckAfter) // idle long enough to be checked
		pool.mu.Unlock()
	}
	if len(resent) != 0 {
		t.Errorf("re-sends %+v, want none: the closed connection should not have been used", resent)
	}
	if n, m := w.Requests.Load(), w.Conns.Load(); n != 2 || m != 2 {
		t.Errorf("the worker read %d requests on %d connections, want 2 on 2", n, m)
	}
}

// Cut ends a call waiting for its answer at once, closing its connection (a worker learns so
// that its client left), and a call that is cut before it takes a connection never sends.
func TestCall_CutClosesTheConnectionInUse(t *testing.T) {
	closed := make(chan struct{})
	w := testkit.NewRawServer(t, func(w *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if w.Read(br) {
			_, _ = br.ReadByte() // no answer: wait for the router to close
			close(closed)
		}
	})
	pool, err := testPools(nil).Pool(w.URL)
	if err != nil {
		t.Fatal(err)
	}
	call := newCall(&peer{})
	call.Deadline = time.Now().Add(time.Minute) // only the cut ends the wait within the test
	call.HeadersBy = call.Deadline
	sent := make(chan *fasthttp.Response, 1)
	go func() {
		resp, _, _ := pool.Send(modelsRequest(w.URL), call)
		sent <- resp
	}()
	for w.Requests.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	call.Cut()
	select {
	case resp := <-sent:
		if resp != nil {
			t.Fatal("a cut call got an answer")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the cut did not end the call")
	}
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the worker's connection stayed open after the cut")
	}
	if resp, _, f := pool.Send(modelsRequest(w.URL), call); resp != nil || f.Kind != "" {
		t.Fatalf("a call cut before it began: answer %v, failure %+v; want neither answer nor upstream error", resp, f)
	}
	if n := w.Requests.Load(); n != 1 {
		t.Errorf("the worker read %d requests, want the one before the cut", n)
	}
}

// A call waiting for its answer's first byte ends, retryable, once its worker is found stalled;
// without CheckStall it waits on.
func TestCall_StalledWorkerEndsTheWaitForTheFirstByte(t *testing.T) {
	w := testkit.NewRawServer(t, func(w *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if w.Read(br) {
			_, _ = br.ReadByte()
		}
	})
	pool, err := testPools(nil).Pool(w.URL)
	if err != nil {
		t.Fatal(err)
	}
	p := &peer{}
	p.stalled.Store(true)
	resp, _, f := pool.Send(modelsRequest(w.URL), newCall(p))
	if resp != nil || f.Kind != KindStalled || !f.Retryable {
		t.Fatalf("answer %v, failure %+v; want a retryable stall", resp, f)
	}
	call := newCall(p)
	call.CheckStall = false
	call.HeadersBy = time.Now().Add(StallPoll * 3)
	if resp, _, f := pool.Send(modelsRequest(w.URL), call); resp != nil || f.Kind != KindFirstByte {
		t.Fatalf("answer %v, failure %+v; want the first-byte deadline to end the wait", resp, f)
	}
}

// A worker that cannot be reached has started nothing: retryable, and not a stale connection.
func TestPool_RefusedConnectionIsRetryable(t *testing.T) {
	ln := testkit.Listen(t)
	url := "http://" + ln.Addr().String()
	_ = ln.Close()
	resent := 0
	pool, err := testPools(func(Failure) { resent++ }).Pool(url)
	if err != nil {
		t.Fatal(err)
	}
	resp, _, f := pool.Send(modelsRequest(url), newCall(&peer{}))
	if resp != nil || f.Kind != KindConnect || !f.Retryable || resent != 0 {
		t.Fatalf("answer %v, failure %+v, %d re-sends; want a retryable connect failure, not re-sent", resp, f, resent)
	}
}
