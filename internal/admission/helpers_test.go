package admission_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// patience bounds every wait for something that must happen; it is generous so that a slow,
// shared machine never fails a correct test. No test asserts how fast anything is.
const patience = 10 * time.Second

func newController(t *testing.T, opts admission.Options) *admission.Controller {
	t.Helper()
	c, err := admission.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func mustAdmit(t *testing.T, c *admission.Controller, tk admission.Ticket) *admission.Permit {
	t.Helper()
	p, err := admitBounded(t, c, tk)
	if err != nil {
		t.Fatalf("Admit(%+v): %v", tk, err)
	}
	return p
}

// admitBounded calls Admit with a context that ends after patience, so that a request which
// should be answered at once fails the test instead of hanging it when it waits.
func admitBounded(t *testing.T, c *admission.Controller, tk admission.Ticket) (*admission.Permit, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), patience)
	defer cancel()
	return c.Admit(ctx, tk)
}

// outcome is what one asynchronous Admit returned.
type outcome struct {
	id     string
	permit *admission.Permit
	err    error
}

// admitAsync calls Admit in a goroutine and delivers its outcome on out.
func admitAsync(ctx context.Context, c *admission.Controller, id string, tk admission.Ticket, out chan<- outcome) {
	go func() {
		p, err := c.Admit(ctx, tk)
		out <- outcome{id: id, permit: p, err: err}
	}()
}

// enqueue starts an Admit that must wait and returns once it is in the queue, so that
// consecutive calls queue in call order.
func enqueue(t *testing.T, c *admission.Controller, id string, tk admission.Ticket, out chan<- outcome) {
	t.Helper()
	want := c.Queued() + 1
	admitAsync(t.Context(), c, id, tk, out)
	testkit.WaitFor(t, "request "+id+" queued", func() bool { return c.Queued() == want })
}

// waiter is a request to queue: its id and its ticket.
type waiter struct {
	id string
	tk admission.Ticket
}

// occupy fills c, which lets one request in at a time: it admits one and holds its permit, then
// queues the waiting requests behind it in order. out, where their outcomes arrive, has room for
// one more, an arrival's. The common start of the tests of a busy controller's queue.
func occupy(t *testing.T, c *admission.Controller, waiting ...waiter) (hold *admission.Permit, out chan outcome) {
	t.Helper()
	hold = mustAdmit(t, c, admission.Ticket{})
	out = make(chan outcome, len(waiting)+1)
	for _, w := range waiting {
		enqueue(t, c, w.id, w.tk, out)
	}
	return hold, out
}

// receive returns the next outcome, failing the test after patience.
func receive(t *testing.T, out <-chan outcome) outcome {
	t.Helper()
	select {
	case o := <-out:
		return o
	case <-time.After(patience):
		t.Fatal("timed out waiting for an Admit to return")
		return outcome{}
	}
}

// drainOrder releases each admitted request as it arrives on out, with at most one in flight,
// and returns the order in which n requests were admitted.
func drainOrder(t *testing.T, n int, out <-chan outcome) []string {
	t.Helper()
	var order []string
	for range n {
		o := receive(t, out)
		if o.err != nil {
			t.Fatalf("request %s: %v", o.id, o.err)
		}
		order = append(order, o.id)
		o.permit.Release()
	}
	return order
}

// recorder is a Reporter that keeps everything it is told.
type recorder struct {
	mu       sync.Mutex
	lengths  map[string]int
	waits    map[string][]time.Duration
	rejected map[string]int // "priority/reason" → count
}

func newRecorder() *recorder {
	return &recorder{lengths: map[string]int{}, waits: map[string][]time.Duration{}, rejected: map[string]int{}}
}

func (r *recorder) QueueLength(priority string, n int) {
	r.mu.Lock()
	r.lengths[priority] = n
	r.mu.Unlock()
}

func (r *recorder) Waited(priority string, d time.Duration) {
	r.mu.Lock()
	r.waits[priority] = append(r.waits[priority], d)
	r.mu.Unlock()
}

func (r *recorder) Rejected(priority string, reason admission.Reason) {
	r.mu.Lock()
	r.rejected[priority+"/"+reason.String()]++
	r.mu.Unlock()
}

func (r *recorder) length(priority string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.lengths[priority]
}

func (r *recorder) rejections(priority string, reason admission.Reason) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rejected[priority+"/"+reason.String()]
}

func (r *recorder) waited(priority string) []time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]time.Duration(nil), r.waits[priority]...)
}
