package admission

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// roomFor is a Fits whose room the test sets.
type roomFor struct{ room atomic.Int64 }

func (r *roomFor) fits(need int) bool { return int64(need) <= r.room.Load() }

// offer makes room tokens of room and offers them to q's waiting requests.
func (r *roomFor) offer(q *SessionQueue, room int64) {
	r.room.Store(room)
	q.Offer()
}

// roomQueue is a queue of up to 8 requests waiting up to a minute for the room of r, which has
// none yet.
func roomQueue() (*SessionQueue, *roomFor) {
	r := &roomFor{}
	return NewSessionQueue(SessionQueueOptions{Max: 8, Timeout: time.Minute, Fits: r.fits}), r
}

// waitAll starts one Wait per ticket, in order, each after the previous is queued, and returns
// the order in which they were offered a try.
func waitAll(t *testing.T, q *SessionQueue, tickets []*SessionTicket) (order chan int, errs chan error) {
	t.Helper()
	order, errs = make(chan int, len(tickets)), make(chan error, len(tickets))
	for i, tk := range tickets {
		go func() {
			err := q.Wait(context.Background(), tk)
			if err == nil {
				order <- i
				return
			}
			errs <- err
		}()
		testkit.WaitFor(t, fmt.Sprint(i+1, " waiting"), func() bool { return q.Waiting() == i+1 })
	}
	return order, errs
}

func TestTheSessionServedLeastGoesFirstWhenRoomAppears(t *testing.T) {
	q, r := roomQueue()
	tickets := []*SessionTicket{{Need: 10, Served: 5000}, {Need: 10, Served: 0}, {Need: 10, Served: 200}}
	order, _ := waitAll(t, q, tickets)
	r.room.Store(100)
	var got []int
	for range tickets {
		q.Offer()
		i := <-order
		got = append(got, i)
		q.Done(tickets[i]) // placed: the next may go
	}
	if got[0] != 1 || got[1] != 2 || got[2] != 0 {
		t.Fatalf("offered in order %v, want [1 2 0]: least attained service first", got)
	}
}

func TestOnlyOneRequestIsOfferedATryUntilItSettles(t *testing.T) {
	var r roomFor
	r.room.Store(100)
	q := NewSessionQueue(SessionQueueOptions{Max: 8, Timeout: time.Minute, Fits: r.fits})
	r.room.Store(0)
	tickets := []*SessionTicket{{Need: 10}, {Need: 10}}
	order, _ := waitAll(t, q, tickets)
	r.offer(q, 100)
	first := <-order
	q.Offer()
	select {
	case i := <-order:
		t.Fatalf("request %d offered a try while request %d had not settled", i, first)
	case <-time.After(300 * time.Millisecond):
	}
	q.Done(tickets[first])
	if second := <-order; second == first {
		t.Fatal("the same request offered twice")
	}
}

func TestASmallerSessionGoesPastOneThatDoesNotFit(t *testing.T) {
	q, r := roomQueue()
	tickets := []*SessionTicket{{Need: 500}, {Need: 50, Served: 10}}
	order, _ := waitAll(t, q, tickets)
	r.offer(q, 100)
	if i := <-order; i != 1 {
		t.Fatalf("request %d offered, want the one whose 50 tokens fit", i)
	}
	if q.Waiting() != 1 {
		t.Fatalf("%d waiting, want the large one still there", q.Waiting())
	}
}

func TestARequestThatWaitsAgainKeepsItsPlace(t *testing.T) {
	q, r := roomQueue()
	a, b := &SessionTicket{Need: 10}, &SessionTicket{Need: 10}
	order, _ := waitAll(t, q, []*SessionTicket{a, b})
	r.offer(q, 100)
	if i := <-order; i != 0 {
		t.Fatalf("request %d went first, want a", i)
	}
	// a lost the room to another request and waits again: it is still ahead of b.
	r.room.Store(0)
	again := make(chan error, 1)
	go func() { again <- q.Wait(context.Background(), a) }()
	testkit.WaitFor(t, "2 waiting", func() bool { return q.Waiting() == 2 })
	r.offer(q, 100)
	select {
	case err := <-again:
		if err != nil {
			t.Fatalf("a's second wait: %v", err)
		}
	case i := <-order:
		t.Fatalf("request %d went before a, which arrived first", i)
	}
}

func TestAFullQueueAndTheDeadlineEndTheWait(t *testing.T) {
	var r roomFor
	q := NewSessionQueue(SessionQueueOptions{Max: 1, Timeout: 200 * time.Millisecond, Fits: r.fits})
	_, errs := waitAll(t, q, []*SessionTicket{{Need: 10}})
	if err := q.Wait(context.Background(), &SessionTicket{Need: 10}); !errors.Is(err, ErrSessionWaitFull) {
		t.Fatalf("a second request in a queue of one: %v, want ErrSessionWaitFull", err)
	}
	if err := <-errs; !errors.Is(err, ErrSessionWaitTimeout) {
		t.Fatalf("the waiting request ended with %v, want ErrSessionWaitTimeout", err)
	}
	if q.Waiting() != 0 {
		t.Fatalf("%d still waiting after the deadline", q.Waiting())
	}
}

func TestAClientThatLeavesLeavesTheQueue(t *testing.T) {
	q, _ := roomQueue()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	var err error
	go func() { defer wg.Done(); err = q.Wait(ctx, &SessionTicket{Need: 10}) }()
	testkit.WaitFor(t, "1 waiting", func() bool { return q.Waiting() == 1 })
	cancel()
	wg.Wait()
	if !errors.Is(err, context.Canceled) || q.Waiting() != 0 {
		t.Fatalf("wait ended with %v, %d waiting; want context.Canceled and none", err, q.Waiting())
	}
}

func TestRoomThatNobodyAnnouncesIsFoundByTheRecheck(t *testing.T) {
	q, r := roomQueue()
	order, _ := waitAll(t, q, []*SessionTicket{{Need: 10}})
	r.room.Store(100) // no Offer: a session's pause outlasted its horizon
	if i := <-order; i != 0 {
		t.Fatalf("offered %d", i)
	}
}
