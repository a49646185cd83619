package workers

import "sync/atomic"

// Outcome is how one attempt on a worker ended, as the breaker and the policy learn it.
type Outcome int

const (
	// Succeeded: the worker answered (any status below 500) and the answer reached its end.
	Succeeded Outcome = iota
	// Failed: the worker could not be reached, answered 5xx, missed the first-byte deadline or
	// broke its answer off.
	Failed
	// Cancelled: the attempt ended without a verdict on the worker (the client went away, or the
	// request's own deadline passed while the worker was streaming).
	Cancelled
)

func (o Outcome) String() string {
	switch o {
	case Succeeded:
		return "succeeded"
	case Failed:
		return "failed"
	default:
		return "cancelled"
	}
}

// Attempt is one accepted try of a request on a worker: the breaker's permission and one unit of
// the worker's load, taken together by Pool.Acquire and given back together by Close.
type Attempt struct {
	pool   *Pool
	worker *Worker
	lease  Lease
	closed atomic.Bool

	pending   atomic.Int64 // prefill tokens this attempt added to the worker and still holds
	prefilled atomic.Bool  // Prefilled or Close ran: no more pending prefill
}

// Acquire asks w's breaker for permission to send one request and, when granted, counts the
// request in w's load. It returns nil when the breaker refuses (open, or half-open with its single
// trial already in flight): the caller chooses again without w. The attempt must be closed exactly
// once; later Close calls do nothing.
func (p *Pool) Acquire(w *Worker) *Attempt {
	if !w.breaker.Acquire() {
		return nil
	}
	w.busy()
	w.sent.Add(1)
	return &Attempt{pool: p, worker: w, lease: Lease{worker: w}}
}

// Worker is the worker the attempt was sent to.
func (a *Attempt) Worker() *Worker { return a.worker }

// Close records the outcome on the worker's breaker and gives its load back, pending prefill
// tokens included (see Prefilled). Only the first call
// counts, so every path that can end a request (answer complete, upstream error, client gone,
// timeout) may call it. It reports whether this call was the one that closed the attempt.
func (a *Attempt) Close(o Outcome) bool {
	if !a.closed.CompareAndSwap(false, true) {
		return false
	}
	switch o {
	case Succeeded:
		a.worker.breaker.Record(true)
	case Failed:
		a.worker.breaker.Record(false)
	default:
		a.worker.breaker.Abandon()
	}
	a.Prefilled()
	a.lease.Release()
	return true
}
