package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// The retry rule: a request is sent again only when it provably did not start generating — the
// dial failed or the worker answered 502/503/504 (next worker, after a backoff), or a pooled
// connection turned out to have been closed by the worker before any answer byte (at once, on a
// fresh connection). A fresh connection that fails after the request was written may have started
// a generation and is never sent again. (The first-byte timeout is in timeouts_test.go.)

func TestRetries_DialErrorGoesToNextWorker(t *testing.T) {
	dead := closedPort(t)
	live := okWorker(t, "live")
	tp := newTestProxy(t, setup{urls: []string{dead, live.URL}}) // round robin: dead first

	status, h, body := tp.post(t, chatPath, chatBody)
	if status != http.StatusOK || !strings.Contains(body, `"live"`) {
		t.Fatalf("got %d %q, want 200 from the live worker", status, body)
	}
	if got := h.Get(HeaderWorker); got != tp.worker(t, live.URL).Name() {
		t.Errorf("%s = %q, want the live worker", HeaderWorker, got)
	}
	if live.Hits.Load() != 1 {
		t.Errorf("live worker hits = %d, want 1", live.Hits.Load())
	}
	tp.wantUpstreamErrors(t, upstream.KindConnect, 1)
	tp.wantRetries(t, 1)
	tp.loadReturnsToZero(t)
}

func TestRetries_503IsRetriedOnTheNextWorker(t *testing.T) {
	busy := testkit.NamedServer(t, http.StatusServiceUnavailable, "busy")
	live := okWorker(t, "live")
	tp := newTestProxy(t, setup{urls: []string{busy.URL, live.URL}})

	status, _, body := tp.post(t, chatPath, chatBody)
	if status != http.StatusOK || !strings.Contains(body, `"live"`) {
		t.Fatalf("got %d %q, want 200 from the live worker", status, body)
	}
	if busy.Hits.Load() != 1 || live.Hits.Load() != 1 {
		t.Errorf("hits busy=%d live=%d, want 1 and 1", busy.Hits.Load(), live.Hits.Load())
	}
	tp.wantUpstreamErrors(t, upstream.KindStatus, 1)
	tp.loadReturnsToZero(t)
}

func TestRetries_FinalAttemptsServerErrorIsPassedThrough(t *testing.T) {
	a := testkit.NamedServer(t, http.StatusServiceUnavailable, "a")
	b := testkit.NamedServer(t, http.StatusServiceUnavailable, "b")
	tp := newTestProxy(t, setup{urls: []string{a.URL, b.URL}})

	status, h, body := tp.post(t, chatPath, chatBody)
	// The last worker's own answer reaches the client, not a router-made error.
	if status != http.StatusServiceUnavailable || !strings.Contains(body, `"worker":"b"`) {
		t.Fatalf("got %d %q, want worker b's own 503", status, body)
	}
	if got := h.Get(HeaderWorker); got != tp.worker(t, b.URL).Name() {
		t.Errorf("%s = %q, want worker b", HeaderWorker, got)
	}
	if a.Hits.Load() != 1 || b.Hits.Load() != 1 {
		t.Errorf("hits a=%d b=%d, want 1 and 1", a.Hits.Load(), b.Hits.Load())
	}
	tp.loadReturnsToZero(t)
}

// A worker that closes every keep-alive connection right after its answer (without saying
// Connection: close) leaves the router a pooled connection that is dead by the time the next
// request takes it. That request never reached the worker, so it is sent again at once on a fresh
// connection: every request succeeds, and the worker sees each one exactly once.
func TestRetries_WorkerClosingKeepAliveConnectionsAfterEachAnswer(t *testing.T) {
	w := testkit.NewRawServer(t, func(rw *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if _, _, err := rw.ReadRequest(br); err != nil {
			return
		}
		const body = `{"ok":true}`
		_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		// returning closes the connection
	})
	tp := newTestProxy(t, setup{urls: []string{w.URL}})

	const n = 200
	failed := 0
	for i := range n {
		status, _, body := tp.post(t, chatPath, chatBody)
		if status != http.StatusOK {
			failed++
			if failed <= 3 {
				t.Errorf("request %d: %d %q", i, status, body)
			}
		}
	}
	if failed > 0 {
		t.Fatalf("%d of %d requests failed", failed, n)
	}
	if got := w.Requests.Load(); got != n {
		t.Errorf("worker read %d requests, want %d (each exactly once)", got, n)
	}
	tp.wantUpstreamErrors(t, upstream.KindSent, 0)
	tp.loadReturnsToZero(t)
}

// A worker whose idle close crosses the router's next request on the wire (the request arrives
// as the worker closes, and is never read) leaves several pooled connections dead at once, none
// of which a check before reuse can catch: each was still open while idle. The request that
// meets one is sent again on a freshly dialled connection, never on the next pooled one, so it
// succeeds however many dead connections the pool still holds.
func TestRetries_StaleConnectionIsResentOnAFreshConnectionNotAnotherPooledOne(t *testing.T) {
	const pooled = 6
	var arrived sync.WaitGroup
	arrived.Add(pooled)
	release := make(chan struct{})
	w := testkit.NewRawServer(t, func(rw *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		if _, _, err := rw.ReadRequest(br); err != nil {
			return
		}
		if rw.Conns.Load() <= pooled {
			// The first requests are held until all of them are in, so that each has its own
			// connection and all of them go back to the pool together.
			arrived.Done()
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
		}
		const body = `{"ok":true}`
		_, _ = fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		_, _ = br.Peek(1) // the next request has arrived: close without reading it
	})
	tp := newTestProxy(t, setup{urls: []string{w.URL}})

	answers := make([]<-chan answer, pooled)
	for i := range pooled {
		answers[i] = tp.sendInBackground(http.MethodPost, chatPath, chatBody)
	}
	done := make(chan struct{})
	go func() { arrived.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the first requests did not reach the worker on their own connections")
	}
	close(release)
	for i, a := range answers {
		if st := (<-a).status; st != http.StatusOK {
			t.Fatalf("concurrent request %d: status %d, want 200", i, st)
		}
	}

	// The pool now holds up to `pooled` connections that the worker will close on the next
	// request each receives.
	const n = 4
	for i := range n {
		if status, _, body := tp.post(t, chatPath, chatBody); status != http.StatusOK {
			t.Errorf("request %d after the pool filled: %d %q, want 200", i, status, body)
		}
	}
	if got := w.Requests.Load(); got != pooled+n {
		t.Errorf("worker read %d requests, want %d (each exactly once)", got, pooled+n)
	}
	tp.loadReturnsToZero(t)
}

// A fresh connection that the worker closes after reading the whole request may have started a
// generation: sending it elsewhere could run it twice, so the client gets 502.
func TestRetries_FreshConnectionClosedAfterTheRequestIsNotRetried(t *testing.T) {
	closer := testkit.NewRawServer(t, func(rw *testkit.RawServer, c net.Conn, br *bufio.Reader) {
		_, _, _ = rw.ReadRequest(br) // read it all, then close without a word
	})
	other := okWorker(t, "other")
	tp := newTestProxy(t, setup{urls: []string{closer.URL, other.URL}})

	status, _, body := tp.post(t, chatPath, chatBody)
	wantErrorAnswer(t, status, body, http.StatusBadGateway, "upstream_unavailable")
	if got := closer.Requests.Load(); got != 1 {
		t.Errorf("closing worker read %d requests, want 1", got)
	}
	if got := other.Hits.Load(); got != 0 {
		t.Errorf("the other worker got %d requests, want 0 (not retried)", got)
	}
	tp.wantUpstreamErrors(t, upstream.KindSent, 1)
	tp.wantRetries(t, 0)
	tp.loadReturnsToZero(t)
}

func TestRetries_OpenBreakerWorkerIsNeverSentTo(t *testing.T) {
	broken := okWorker(t, "broken")
	live := okWorker(t, "live")
	tp := newTestProxy(t, setup{
		urls: []string{broken.URL, live.URL},
		pool: &workers.Options{CBFailureThreshold: 1, CBTimeout: time.Minute},
	})
	tp.worker(t, broken.URL).Breaker().Record(false) // one failure opens it for a minute

	for i := range 6 {
		if status, _, body := tp.post(t, chatPath, chatBody); status != http.StatusOK || !strings.Contains(body, `"live"`) {
			t.Fatalf("request %d: got %d %q, want 200 from the live worker", i, status, body)
		}
	}
	if got := broken.Hits.Load(); got != 0 {
		t.Errorf("the worker with an open breaker got %d requests, want 0", got)
	}
	tp.loadReturnsToZero(t)
}

// recordingPolicy wraps a policy and records what it was taught. trip, when set, runs at the end
// of the first Select with its decision: a test uses it to open the chosen worker's breaker
// between the choice and the attempt, which is when a breaker refuses in production (another
// request took the half-open trial, or failed and opened it).
type recordingPolicy struct {
	policy.Policy
	trip func(policy.Decision)

	mu        sync.Mutex
	selects   int
	committed []string // worker names, in order
	observed  []string // "name outcome"
}

func (p *recordingPolicy) Select(in policy.Input) policy.Decision {
	d := p.Policy.Select(in)
	p.mu.Lock()
	p.selects++
	first := p.selects == 1
	p.mu.Unlock()
	if first && p.trip != nil {
		p.trip(d)
	}
	return d
}

func (p *recordingPolicy) Accepted(in policy.Input, d policy.Decision) {
	p.mu.Lock()
	p.committed = append(p.committed, d.Worker.Name())
	p.mu.Unlock()
	p.Policy.Accepted(in, d)
}

func (p *recordingPolicy) Done(in policy.Input, d policy.Decision, o workers.Outcome, u policy.Usage) bool {
	p.mu.Lock()
	p.observed = append(p.observed, d.Worker.Name()+" "+o.String())
	p.mu.Unlock()
	return p.Policy.Done(in, d, o, u)
}

func (p *recordingPolicy) record() (committed, observed []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]string(nil), p.committed...), append([]string(nil), p.observed...)
}

func newCacheAware(t *testing.T) policy.Policy {
	t.Helper()
	p, err := policy.New(cacheaware.Name, policy.Env{SessionTTL: time.Hour, MaxSessions: 1000}, &cacheaware.Knobs{
		CacheThreshold: 0.5, BalanceAbsThreshold: 32, BalanceRelThreshold: 1.5, HistoryMatchMode: cacheaware.HistoryCost,
		MaxTreeSize: 1 << 20, EvictionIntervalSecs: 60,
	})
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// When the breaker refuses the worker the policy chose, the request goes to another worker, and
// the policy learns only about the worker that served: the refused one is never committed, so
// the session is pinned where its cache really is.
func TestRetries_BreakerRefusalTeachesThePolicyNothing(t *testing.T) {
	a := okWorker(t, "a")
	b := okWorker(t, "b")
	var tripped *workers.Worker
	rec := &recordingPolicy{Policy: newCacheAware(t), trip: func(d policy.Decision) {
		tripped = d.Worker
		d.Worker.Breaker().Record(false) // threshold 1: open now
	}}
	tp := newTestProxy(t, setup{
		urls:   []string{a.URL, b.URL},
		policy: rec,
		pool:   &workers.Options{CBFailureThreshold: 1, CBTimeout: time.Minute},
	})

	status, h, body := tp.post(t, chatPath, chatBody, "x-session-id", "s-refusal")
	if status != http.StatusOK {
		t.Fatalf("got %d %q, want 200", status, body)
	}
	if tripped == nil {
		t.Fatal("the policy was never asked")
	}
	served := h.Get(HeaderWorker)
	if served == tripped.Name() {
		t.Fatalf("the refused worker %s served the request", served)
	}
	if got := a.Hits.Load() + b.Hits.Load(); got != 1 {
		t.Errorf("workers got %d requests, want 1", got)
	}
	committed, observed := rec.record()
	if len(committed) != 1 || committed[0] != served {
		t.Errorf("committed %v, want only the serving worker %s", committed, served)
	}
	for _, o := range observed {
		if strings.HasPrefix(o, tripped.Name()+" ") {
			t.Errorf("the refused worker was observed: %v", observed)
		}
	}
	if tripped.Load() != 0 {
		t.Errorf("the refused worker's load is %d, want 0", tripped.Load())
	}

	// Both workers available again: the session's next turn goes where it was served.
	tripped.Breaker().Record(true)
	status, h, body = tp.post(t, chatPath, chatBody, "x-session-id", "s-refusal")
	if status != http.StatusOK {
		t.Fatalf("second turn: got %d %q", status, body)
	}
	if got := h.Get(HeaderWorker); got != served {
		t.Errorf("second turn went to %s (decision %s), want %s where the session was served",
			got, h.Get(HeaderDecision), served)
	}
	if got := h.Get(HeaderDecision); got != cacheaware.LabelSessionMatch {
		t.Errorf("second turn decision %q, want %s", got, cacheaware.LabelSessionMatch)
	}
	tp.loadReturnsToZero(t)
}

func TestRetries_StopAtMaxRetries(t *testing.T) {
	for _, maxRetries := range []int{0, 1, 2} {
		t.Run(fmt.Sprintf("max_retries=%d", maxRetries), func(t *testing.T) {
			// Four workers that all answer 503, each noting when it was asked.
			var seq atomic.Int64
			order := make([]atomic.Int64, 4) // 0: never asked, else the position in which it was
			var urls []string
			for i := range order {
				w := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					order[i].CompareAndSwap(0, seq.Add(1))
					w.WriteHeader(http.StatusServiceUnavailable)
					_, _ = fmt.Fprintf(w, `{"worker":"w%d"}`, i)
				})
				urls = append(urls, w.URL)
			}
			opts := testOptions()
			opts.MaxRetries = maxRetries
			tp := newTestProxy(t, setup{opts: &opts, urls: urls})

			status, _, body := tp.post(t, chatPath, chatBody)
			if got := seq.Load(); got != int64(maxRetries+1) {
				t.Fatalf("%d attempts, want %d (one and %d retries)", got, maxRetries+1, maxRetries)
			}
			last := -1
			for i := range order {
				if order[i].Load() == int64(maxRetries+1) {
					last = i
				}
			}
			// The final attempt's own answer is passed through.
			if want := fmt.Sprintf(`{"worker":"w%d"}`, last); status != http.StatusServiceUnavailable || body != want {
				t.Errorf("got %d %q, want the final attempt's 503 %s", status, body, want)
			}
			if got := testutil.ToFloat64(tp.Metrics.Retries); got != float64(maxRetries) {
				t.Errorf("retries_total = %v, want %d", got, maxRetries)
			}
			tp.loadReturnsToZero(t)
		})
	}
}

func TestRetries_StopAtMaxRetriesOnDialErrors(t *testing.T) {
	urls := []string{closedPort(t), closedPort(t), closedPort(t), closedPort(t)}
	opts := testOptions()
	opts.MaxRetries = 1
	tp := newTestProxy(t, setup{opts: &opts, urls: urls})

	status, _, body := tp.post(t, chatPath, chatBody)
	if status != http.StatusBadGateway {
		t.Fatalf("got %d %q, want 502", status, body)
	}
	tp.wantUpstreamErrors(t, upstream.KindConnect, 2, " (one attempt and one retry)")
	tp.wantRetries(t, 1)
}
