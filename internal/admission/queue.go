package admission

// The waiting room: one level per priority; in each level a ring of the tenants that have
// waiters, served round-robin; in each tenant a FIFO list of its waiters. Every list is
// intrusive and doubly linked, so a waiter that gives up leaves in O(1), and a tenant leaves
// the ring (and the level's map) with its last waiter, so the state is bounded by the waiters.
// Everything here is guarded by Controller.mu.

// waitState is where a waiter stands; it changes once, from waiting, under Controller.mu.
type waitState uint8

const (
	waiting   waitState = iota
	admitted            // taken out of the queue and counted in flight
	displaced           // taken out of the queue to make room for a more deserving arrival
)

// waiter is one request in the queue. Its goroutine blocks on ch, which is closed when the
// waiter leaves the queue by admission or displacement.
type waiter struct {
	model      string
	level      int // index of its level in Controller.levels
	ch         chan struct{}
	state      waitState
	tq         *tenantQueue
	prev, next *waiter
}

// tenantQueue is one tenant's waiters at one level, oldest first, and its place in the ring.
type tenantQueue struct {
	name       string
	head, tail *waiter
	n          int
	prev, next *tenantQueue
}

// level is the queue of one priority.
type level struct {
	name    string
	tenants map[string]*tenantQueue // the tenants with waiters, and only those
	next    *tenantQueue            // the tenant served next; nil when the level is empty
	n       int                     // waiters at this level
}

// push appends w to tenant's waiters, adding the tenant to the ring as the last one served in
// the current round when it had none.
func (l *level) push(tenant string, w *waiter) {
	tq := l.tenants[tenant]
	if tq == nil {
		tq = &tenantQueue{name: tenant}
		l.tenants[tenant] = tq
		if l.next == nil {
			tq.prev, tq.next = tq, tq
			l.next = tq
		} else {
			last := l.next.prev
			tq.prev, tq.next = last, l.next
			last.next = tq
			l.next.prev = tq
		}
	}
	w.tq = tq
	w.prev = tq.tail
	if tq.tail == nil {
		tq.head = w
	} else {
		tq.tail.next = w
	}
	tq.tail = w
	tq.n++
	l.n++
}

// remove takes w out of its tenant's list, and the tenant out of the ring when w was its last.
func (l *level) remove(w *waiter) {
	tq := w.tq
	if w.prev == nil {
		tq.head = w.next
	} else {
		w.prev.next = w.next
	}
	if w.next == nil {
		tq.tail = w.prev
	} else {
		w.next.prev = w.prev
	}
	w.prev, w.next, w.tq = nil, nil, nil
	tq.n--
	l.n--
	if tq.n > 0 {
		return
	}
	if tq.next == tq {
		l.next = nil
	} else {
		tq.prev.next = tq.next
		tq.next.prev = tq.prev
		if l.next == tq {
			l.next = tq.next
		}
	}
	tq.prev, tq.next = nil, nil
	delete(l.tenants, tq.name)
}

// pick returns the waiter this level would admit next, or nil: going round the ring from the
// tenant due next, the oldest waiter of the first tenant that has one ok accepts. The ring
// moves on past that tenant, so tenants take turns whatever their number of waiters.
func (l *level) pick(ok func(model string) bool) *waiter {
	start := l.next
	if start == nil {
		return nil
	}
	tq := start
	for {
		for w := tq.head; w != nil; w = w.next {
			if ok(w.model) {
				l.next = tq.next
				return w
			}
		}
		tq = tq.next
		if tq == start {
			return nil
		}
	}
}

// largest returns the tenant with the most waiters at this level (the first of equals in ring
// order from the tenant due next), or nil when the level is empty.
func (l *level) largest() *tenantQueue {
	start := l.next
	if start == nil {
		return nil
	}
	big := start
	for tq := start.next; tq != start; tq = tq.next {
		if tq.n > big.n {
			big = tq
		}
	}
	return big
}
