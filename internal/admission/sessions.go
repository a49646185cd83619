package admission

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"sync"
	"time"
)

// Session admission: a session whose working set no worker's KV cache has room for waits here,
// instead of being placed where the engine would make room by evicting the cache of a session
// that is coming back. The policy decides who must wait (its Select holds the request) and what
// fits (Fits); this queue decides who goes next and when, with no worker in mind.
//
// The order is least attained service first: the waiting session that has been served the
// fewest prompt tokens so far goes first (a new session before an evicted one that already ran
// for an hour), then arrival order. A request is offered a try when room may have appeared
// (Offer, and every SessionRecheck while any wait) and its need fits: it then chooses again; if
// the room went to another, it waits again in its old place. One request is offered at a time, so
// that the room it takes is counted before the next is offered; a smaller session behind a larger
// one that does not fit goes first. Turns of sessions whose cache is resident never come here.

// SessionRecheck is how often the waiting requests are offered room while any wait, besides every
// Offer: room also appears when a session's pause outlasts its horizon, which nothing announces.
// Every SessionRetry the first waiting request is offered a try whatever Fits says, since room
// can also appear where the policy has not looked yet (a worker that joined the fleet).
const (
	SessionRecheck = 100 * time.Millisecond
	SessionRetry   = time.Second
)

// sessionTransit bounds how long a request offered a try holds the next back: it chooses at once,
// so one that has neither placed itself nor waited again by then is not waited for.
const sessionTransit = time.Second

// Session wait outcomes besides a try.
var (
	// ErrSessionWaitFull: the queue holds SessionQueueOptions.Max requests already.
	ErrSessionWaitFull = errors.New("admission: the session queue is full")
	// ErrSessionWaitTimeout: the request waited SessionQueueOptions.Timeout since its first hold.
	ErrSessionWaitTimeout = errors.New("admission: waited for KV room until the deadline")
)

// SessionQueueOptions configure a SessionQueue.
type SessionQueueOptions struct {
	// Max bounds the requests waiting; one more is answered ErrSessionWaitFull at once.
	Max int
	// Timeout bounds a request's waits together, from its first hold.
	Timeout time.Duration
	// Fits says whether some worker has room for a working set of need tokens now. It is called
	// with the queue's lock held, and must not call back into the queue.
	Fits func(need int) bool
	// Now is the clock; tests inject one. time.Now.
	Now func() time.Time
}

// SessionQueue orders the requests waiting for KV room. It is safe for concurrent use.
type SessionQueue struct {
	opts    SessionQueueOptions
	mu      sync.Mutex
	waiting sessionHeap
	seq     uint64
	transit *SessionTicket // offered a try, not yet back or gone
	offered time.Time      // when transit was offered its try
	ticker  *time.Ticker   // runs while any wait
	stop    chan struct{}
}

// NewSessionQueue returns an empty queue.
func NewSessionQueue(opts SessionQueueOptions) *SessionQueue {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Fits == nil {
		opts.Fits = func(int) bool { return true }
	}
	return &SessionQueue{opts: opts}
}

// SessionTicket is one request's place: it keeps its order and its deadline across its waits.
type SessionTicket struct {
	// Need is the working set the request brings, in tokens.
	Need int
	// Served is its session's attained service, in prompt tokens.
	Served int64
	seq    uint64
	first  time.Time
	index  int // in the heap; -1 when not waiting
	ready  chan struct{}
}

// Waiting is the number of requests waiting.
func (q *SessionQueue) Waiting() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiting)
}

// Wait holds the request of ticket t until it is offered a try (nil: choose again), its deadline
// passes (ErrSessionWaitTimeout), the queue is full (ErrSessionWaitFull, at once) or ctx ends
// (its error). A ticket is used by one request, one Wait at a time; Done must follow the last.
func (q *SessionQueue) Wait(ctx context.Context, t *SessionTicket) error {
	q.mu.Lock()
	now := q.opts.Now()
	if t.first.IsZero() {
		q.seq++
		t.seq, t.first, t.index = q.seq, now, -1
	}
	if q.transit == t {
		q.transit = nil
	}
	deadline := t.first.Add(q.opts.Timeout)
	if !now.Before(deadline) {
		q.mu.Unlock()
		q.Offer()
		return ErrSessionWaitTimeout
	}
	if len(q.waiting) >= q.opts.Max {
		q.mu.Unlock()
		q.Offer()
		return ErrSessionWaitFull
	}
	t.ready = make(chan struct{})
	heap.Push(&q.waiting, t)
	q.startTicker()
	ready := t.ready
	q.mu.Unlock()
	q.Offer() // the room it was refused may already be back, or another's turn may be due

	timer := time.NewTimer(deadline.Sub(now))
	defer timer.Stop()
	select {
	case <-ready:
		return nil
	case <-timer.C:
		if q.leave(t) {
			return ErrSessionWaitTimeout
		}
		return nil // offered a try as the deadline came: take it
	case <-ctx.Done():
		q.leave(t)
		q.Done(t)
		return ctx.Err()
	}
}

// leave takes t out of the queue; false when it was offered a try first.
func (q *SessionQueue) leave(t *SessionTicket) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t.index < 0 {
		return false
	}
	heap.Remove(&q.waiting, t.index)
	return true
}

// Done says the request of t no longer waits: it was placed, or gave up. The next is offered.
func (q *SessionQueue) Done(t *SessionTicket) {
	q.mu.Lock()
	if q.transit == t {
		q.transit = nil
	}
	q.mu.Unlock()
	q.Offer()
}

// Offer offers a try to the first waiting request, in the queue's order, whose need fits, unless
// one offered before has not settled yet. Call it when room may have appeared.
func (q *SessionQueue) Offer() { q.offer(q.opts.Fits) }

func (q *SessionQueue) offer(fits func(int) bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.opts.Now()
	if q.transit != nil && now.Sub(q.offered) < sessionTransit {
		return
	}
	q.transit = nil
	// The heap is in order at its root only: sort a copy, leaving the heap's indexes alone.
	order := slices.Clone(q.waiting)
	slices.SortFunc(order, func(a, b *SessionTicket) int {
		if a.before(b) {
			return -1
		}
		return 1
	})
	for _, t := range order {
		if fits(t.Need) {
			heap.Remove(&q.waiting, t.index)
			q.transit, q.offered = t, now
			close(t.ready)
			return
		}
	}
}

// startTicker runs the recheck while any wait; called with the lock held.
func (q *SessionQueue) startTicker() {
	if q.ticker != nil {
		return
	}
	q.ticker = time.NewTicker(SessionRecheck)
	q.stop = make(chan struct{})
	go q.recheck(q.ticker, q.stop)
}

func (q *SessionQueue) recheck(t *time.Ticker, stop chan struct{}) {
	defer t.Stop()
	anyway := func(int) bool { return true }
	for tick := 1; ; tick++ {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		q.mu.Lock()
		idle := len(q.waiting) == 0
		if idle {
			q.ticker = nil
			close(stop)
		}
		q.mu.Unlock()
		if idle {
			return
		}
		if tick%int(SessionRetry/SessionRecheck) == 0 {
			q.offer(anyway)
		} else {
			q.Offer()
		}
	}
}

// sessionHeap orders tickets by attained service, then arrival.
type sessionHeap []*SessionTicket

func (h sessionHeap) Len() int           { return len(h) }
func (h sessionHeap) Less(i, j int) bool { return h[i].before(h[j]) }

// before: least attained service first, then arrival.
func (t *SessionTicket) before(o *SessionTicket) bool {
	if t.Served != o.Served {
		return t.Served < o.Served
	}
	return t.seq < o.seq
}
func (h sessionHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *sessionHeap) Push(x any) {
	t := x.(*SessionTicket)
	t.index = len(*h)
	*h = append(*h, t)
}
func (h *sessionHeap) Pop() any {
	old := *h
	t := old[len(old)-1]
	old[len(old)-1] = nil
	t.index = -1
	*h = old[:len(old)-1]
	return t
}
