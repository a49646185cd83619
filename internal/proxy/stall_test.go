package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/upstream"
)

// An attempt still waiting for the first byte of its answer when its worker is found stalled has
// sent nothing to its client: it is failed and retried on another worker at once, not left to
// wait out the request timeout. The stalled worker takes no new request meanwhile. (How a worker
// is found stalled is in internal/workers.)
func TestStall_AttemptWaitingOnAStalledWorkerIsRetriedElsewhere(t *testing.T) {
	hung := hangingWorker(t)
	live := okWorker(t, "live")
	opts := testOptions()
	opts.Upstream.Timeouts.Request = time.Minute // far beyond the bounds waited on here

	tp := newTestProxy(t, setup{opts: &opts, urls: []string{hung.URL, live.URL}}) // round robin: hung first

	done := tp.sendInBackground(http.MethodPost, chatPath, chatBody)
	testkit.WaitWithin(t, 5*time.Second, "the hung worker has the request", func() bool { return hung.Requests.Load() == 1 })
	tp.worker(t, hung.URL).SetStalled(true)

	select {
	case a := <-done:
		if a.status != http.StatusOK || !strings.Contains(a.body, `"live"`) {
			t.Fatalf("got %d %q, want 200 from the live worker", a.status, a.body)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the request still waits on the stalled worker")
	}
	tp.wantUpstreamErrors(t, upstream.KindStalled, 1)
	if status, _, body := tp.post(t, chatPath, chatBody); status != http.StatusOK || !strings.Contains(body, `"live"`) {
		t.Errorf("next request: %d %q, want the live worker (the stalled one is out of rotation)", status, body)
	}
	if got := hung.Requests.Load(); got != 1 {
		t.Errorf("the stalled worker got %d requests, want 1", got)
	}
	tp.loadReturnsToZero(t)
}

// A worker found stalled while a request was under way is not among its retries: after the
// first worker answered 503, the retry goes past the one found stalled meanwhile, which never
// sees the request.
func TestStall_ARetrySkipsAWorkerFoundStalledSinceTheRequestBegan(t *testing.T) {
	hung := hangingWorker(t)
	live := okWorker(t, "live")
	var tp *testProxy
	busy := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		tp.worker(t, hung.URL).SetStalled(true) // found meanwhile, by another request or the checks
		w.WriteHeader(http.StatusServiceUnavailable)
	})
	opts := testOptions()
	opts.Upstream.Timeouts.Request = time.Minute
	// Round robin: busy first; the retry's pick among what is left would be the hung worker.
	tp = newTestProxy(t, setup{opts: &opts, urls: []string{busy.URL, live.URL, hung.URL}})
	tp.Client.Timeout = 15 * time.Second

	status, _, body := tp.post(t, chatPath, chatBody)
	if status != http.StatusOK || !strings.Contains(body, `"live"`) {
		t.Fatalf("got %d %q, want 200 from the live worker", status, body)
	}
	if got := hung.Requests.Load(); got != 0 {
		t.Errorf("the stalled worker read %d requests, want 0", got)
	}
	tp.wantUpstreamErrors(t, upstream.KindStalled, 0, ": no attempt went there")
	tp.loadReturnsToZero(t)
}
