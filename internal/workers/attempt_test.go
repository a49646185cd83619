package workers

import (
	"sync"
	"testing"
	"time"
)

func TestAttemptTakesLoadAndGivesItBackExactlyOnce(t *testing.T) {
	p := NewPool(Options{CBFailureThreshold: 3, CBTimeout: time.Hour})
	added, _ := p.Add("http://w")
	w := added[0]
	a := p.Acquire(w)
	if a == nil || w.Load() != 1 {
		t.Fatalf("acquire: attempt %v, load %d", a, w.Load())
	}
	var wg sync.WaitGroup
	closed := make(chan bool, 8)
	for range 8 {
		wg.Go(func() { closed <- a.Close(Failed) })
	}
	wg.Wait()
	close(closed)
	n := 0
	for c := range closed {
		if c {
			n++
		}
	}
	if n != 1 || w.Load() != 0 {
		t.Fatalf("%d closes counted, load %d; want 1 and 0", n, w.Load())
	}
}

func TestAttemptOutcomesReachTheBreaker(t *testing.T) {
	p := NewPool(Options{CBFailureThreshold: 2, CBTimeout: time.Hour})
	added, _ := p.Add("http://w")
	w := added[0]
	p.Acquire(w).Close(Failed)
	p.Acquire(w).Close(Cancelled) // no verdict: does not count towards the threshold
	if w.Breaker().State() != BreakerClosed {
		t.Fatal("one failure and one cancellation opened the breaker")
	}
	p.Acquire(w).Close(Failed)
	if w.Breaker().State() != BreakerOpen {
		t.Fatal("two consecutive failures did not open the breaker")
	}
	if a := p.Acquire(w); a != nil || w.Load() != 0 {
		t.Fatalf("an open breaker granted an attempt (load %d)", w.Load())
	}
}

func TestHalfOpenBreakerGrantsOneAttemptUntilItCloses(t *testing.T) {
	p := NewPool(Options{CBFailureThreshold: 1, CBTimeout: time.Hour})
	added, _ := p.Add("http://w")
	w := added[0]
	now := time.Now()
	w.Breaker().now = func() time.Time { return now }
	p.Acquire(w).Close(Failed)
	now = now.Add(2 * time.Hour) // half-open
	trial := p.Acquire(w)
	if trial == nil {
		t.Fatal("half-open breaker refused its trial")
	}
	if p.Acquire(w) != nil {
		t.Fatal("half-open breaker granted a second attempt while the trial runs")
	}
	trial.Close(Cancelled) // the trial's client left: another may try
	second := p.Acquire(w)
	if second == nil {
		t.Fatal("a cancelled trial kept the half-open slot")
	}
	second.Close(Succeeded)
	if w.Breaker().State() != BreakerClosed || w.Load() != 0 {
		t.Fatalf("after a successful trial: %s, load %d", w.Breaker().State(), w.Load())
	}
}
