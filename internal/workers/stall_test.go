package workers

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// hungWorker answers its health endpoint and /v1/models, and its POSTs only while answering is
// set: otherwise it holds them until the client gives up, as a hung engine does.
type hungWorker struct {
	srv       *httptest.Server
	answering atomic.Bool
	posts     atomic.Int32
}

func newHungWorker(t *testing.T) *hungWorker {
	t.Helper()
	h := &hungWorker{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []map[string]string{{"id": "m"}}})
	})
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, r *http.Request) {
		h.posts.Add(1)
		_, _ = io.Copy(io.Discard, r.Body)
		if !h.answering.Load() {
			<-r.Context().Done()
			return
		}
		_, _ = io.WriteString(w, `{"choices":[{"message":{"content":"."}}]}`)
	})
	h.srv = httptest.NewServer(mux)
	t.Cleanup(h.srv.Close)
	return h
}

func newStallChecker(p *Pool, stall time.Duration) *Checker {
	return newTestChecker(p, HealthOptions{StallTimeout: stall})
}

// stallRig registers h in a pool, with a checker of the given stall timeout that has probed it
// once.
func stallRig(t *testing.T, h *hungWorker, stall time.Duration) (*Pool, *Worker, *Checker) {
	t.Helper()
	p := NewPool(Options{})
	added, err := p.Add(h.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	c := newStallChecker(p, stall)
	c.Check(context.Background(), h.srv.URL)
	return p, added[0], c
}

// A worker that has requests in flight, has sent no byte on any of them for the stall timeout,
// and does not answer a probe request either is stalled: out of rotation, although its health
// endpoint answers. It comes back when a probe request is answered.
func TestStall_WorkerWithNoProgressThatDoesNotAnswerAProbeIsTakenOutUntilOneIsAnswered(t *testing.T) {
	h := newHungWorker(t)
	p, w, c := stallRig(t, h, 200*time.Millisecond)
	ctx := context.Background()
	if !w.Available() {
		t.Fatal("the worker is not available after a passing health check")
	}
	at := p.Acquire(w) // a request in flight that gets nothing back
	defer at.Close(Cancelled)

	c.checkStalls(ctx) // too early: it is not suspect yet
	if got := h.posts.Load(); got != 0 {
		t.Fatalf("%d probe requests before the stall timeout passed", got)
	}
	testkit.WaitFor(t, "the worker is found stalled", func() bool {
		c.checkStalls(ctx)
		return w.Stalled()
	})
	if w.Available() || !w.Healthy() {
		t.Errorf("stalled worker: available=%v healthy=%v, want out of rotation while its health endpoint passes", w.Available(), w.Healthy())
	}

	h.answering.Store(true)
	testkit.WaitFor(t, "the worker is back once a probe request is answered", func() bool {
		c.checkStalls(ctx)
		return !w.Stalled()
	})
	if !w.Available() {
		t.Error("the worker is not available again")
	}
}

// A worker busy with a long generation sends nothing for a while, but answers a probe request:
// it is making progress and is never taken out.
func TestStall_BusyWorkerThatAnswersItsProbeIsNotStalled(t *testing.T) {
	h := newHungWorker(t)
	h.answering.Store(true)
	p, w, c := stallRig(t, h, 100*time.Millisecond)
	ctx := context.Background()
	at := p.Acquire(w)
	defer at.Close(Cancelled)
	testkit.WaitFor(t, "a few probe requests", func() bool {
		c.checkStalls(ctx)
		return h.posts.Load() >= 2
	})
	if w.Stalled() {
		t.Error("a worker that answers its probe requests is stalled")
	}
}

// A worker with nothing in flight is never suspect, however long it has been quiet; nor is one
// whose bytes keep coming, for however long its requests run.
func TestStall_IdleOrProgressingWorkerIsNeverProbed(t *testing.T) {
	h := newHungWorker(t)
	p, w, c := stallRig(t, h, 300*time.Millisecond)
	ctx := context.Background()
	time.Sleep(400 * time.Millisecond) // idle past the stall timeout
	c.checkStalls(ctx)

	at := p.Acquire(w)
	defer at.Close(Cancelled)
	for range 6 { // 600 ms in flight, a byte every 100 ms
		time.Sleep(100 * time.Millisecond)
		w.Progressed()
		c.checkStalls(ctx)
	}
	if got := h.posts.Load(); got != 0 || w.Stalled() {
		t.Errorf("%d probe requests, stalled=%v; want none and false", got, w.Stalled())
	}
}

// A request whose first-byte deadline passed on a worker that sent no byte of any answer for as
// long marks the worker stalled at once, with every tenant of its URL, without waiting for the
// stall checks: the next request does not go there.
func TestStall_MissedFirstByteOnASilentWorkerMarksItStalledAtOnce(t *testing.T) {
	p := NewPool(Options{DPSize: 2})
	tenants, err := p.Add("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range tenants {
		w.SetHealthy(true)
	}
	at := p.Acquire(tenants[0])
	defer at.Close(Failed)
	if !at.MissedFirstByte(0) { // no byte since it was sent
		t.Fatal("the silent worker was not marked")
	}
	for _, w := range tenants {
		if !w.Stalled() || w.Available() {
			t.Errorf("%s: stalled=%v available=%v, want stalled and out of rotation", w.Name(), w.Stalled(), w.Available())
		}
	}
	if at.MissedFirstByte(0) {
		t.Error("an already stalled worker was marked again")
	}
}

// A worker that sent a byte of any answer within the first-byte timeout is busy, not stalled: a
// request that missed its deadline there leaves it in rotation.
func TestStall_MissedFirstByteOnAProgressingWorkerLeavesItInRotation(t *testing.T) {
	p := NewPool(Options{})
	added, err := p.Add("http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	w := added[0]
	w.SetHealthy(true)
	at := p.Acquire(w)
	defer at.Close(Failed)
	w.Progressed() // another request's answer moved just now
	if at.MissedFirstByte(time.Minute) || w.Stalled() {
		t.Fatal("a worker that sent a byte within the timeout was marked stalled")
	}
}

// Without stall checks (stall timeout 0) a worker marked stalled by a missed first byte is still
// probed, within the health check's timeout, and comes back at the first probe request answered.
func TestStall_WorkerMarkedByAMissedFirstByteComesBackWithoutStallChecks(t *testing.T) {
	h := newHungWorker(t)
	p, w, c := stallRig(t, h, 0)
	ctx := context.Background()
	at := p.Acquire(w)
	if !at.MissedFirstByte(0) {
		t.Fatal("not marked")
	}
	at.Close(Failed)
	h.answering.Store(true)
	testkit.WaitFor(t, "the marked worker is back once a probe request is answered", func() bool {
		c.checkStalls(ctx)
		return !w.Stalled()
	})
	if got := h.posts.Load(); got < 1 {
		t.Errorf("%d probe requests, want at least one", got)
	}
}
