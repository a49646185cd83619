package workers

import (
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

func newTestBreaker(threshold int, timeout time.Duration) (*Breaker, *testkit.Clock) {
	clk := testkit.NewClock()
	b := NewBreaker(threshold, timeout, false)
	b.now = clk.Now
	return b, clk
}

// fail records n failed requests, each sent after Acquire.
func fail(t *testing.T, b *Breaker, n int) {
	t.Helper()
	for range n {
		if !b.Acquire() {
			t.Fatalf("Acquire refused in state %v", b.State())
		}
		b.Record(false)
	}
}

// halfOpen returns a breaker of threshold that failed threshold times and then waited out its
// timeout: half-open, its trial not yet taken.
func halfOpen(t *testing.T, threshold int, timeout time.Duration) (*Breaker, *testkit.Clock) {
	t.Helper()
	b, clk := newTestBreaker(threshold, timeout)
	fail(t, b, threshold)
	clk.Advance(timeout)
	return b, clk
}

// checkOpenFor fails unless b, opened at clk's present time, stays open and lets nothing through
// until just before timeout has passed, and at timeout is half-open, offering a trial.
func checkOpenFor(t *testing.T, b *Breaker, clk *testkit.Clock, timeout time.Duration) {
	t.Helper()
	clk.Advance(timeout - time.Nanosecond)
	if b.State() != BreakerOpen || b.Allows() {
		t.Fatalf("just before the timeout: state %v, want open", b.State())
	}
	clk.Advance(time.Nanosecond)
	if b.State() != BreakerHalfOpen || !b.Allows() {
		t.Fatalf("at the timeout: state %v, want half_open and allowing a trial", b.State())
	}
}

// inTrial is halfOpen with the trial taken.
func inTrial(t *testing.T, threshold int, timeout time.Duration) (*Breaker, *testkit.Clock) {
	t.Helper()
	b, clk := halfOpen(t, threshold, timeout)
	if !b.Acquire() {
		t.Fatalf("the half-open breaker refused the trial (state %v)", b.State())
	}
	return b, clk
}

func TestBreakerOpensAfterThresholdConsecutiveFailures(t *testing.T) {
	b, _ := newTestBreaker(3, 10*time.Second)
	fail(t, b, 2)
	if b.State() != BreakerClosed || !b.Allows() {
		t.Fatalf("after 2 of 3 failures: state %v, want closed", b.State())
	}
	fail(t, b, 1)
	if b.State() != BreakerOpen {
		t.Fatalf("after 3 of 3 failures: state %v, want open", b.State())
	}
	if b.Allows() || b.Acquire() {
		t.Error("open breaker lets a request through")
	}
}

func TestBreakerSuccessResetsFailureCount(t *testing.T) {
	b, _ := newTestBreaker(3, 10*time.Second)
	fail(t, b, 2)
	b.Record(true)
	fail(t, b, 2)
	if b.State() != BreakerClosed {
		t.Fatalf("2 failures, success, 2 failures opened a threshold-3 breaker: state %v", b.State())
	}
	fail(t, b, 1)
	if b.State() != BreakerOpen {
		t.Fatalf("3 consecutive failures: state %v, want open", b.State())
	}
}

func TestBreakerStaysOpenUntilTimeout(t *testing.T) {
	b, clk := newTestBreaker(1, 10*time.Second)
	fail(t, b, 1)
	checkOpenFor(t, b, clk, 10*time.Second)
}

func TestBreakerHalfOpenLetsExactlyOneTrialThrough(t *testing.T) {
	b, _ := inTrial(t, 2, time.Minute)
	if b.Allows() {
		t.Error("half-open breaker with a trial in flight still allows")
	}
	if b.Acquire() {
		t.Error("half-open breaker let a second request through")
	}
	if b.State() != BreakerHalfOpen {
		t.Errorf("state %v during the trial, want half_open", b.State())
	}
}

func TestBreakerHalfOpenConcurrentAcquireHasOneWinner(t *testing.T) {
	b, _ := halfOpen(t, 1, time.Second)
	var wg sync.WaitGroup
	var mu sync.Mutex
	wins := 0
	for range 16 {
		wg.Go(func() {
			if b.Acquire() {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d concurrent callers got the half-open trial, want exactly 1", wins)
	}
}

func TestBreakerTrialSuccessCloses(t *testing.T) {
	b, _ := inTrial(t, 2, time.Minute)
	b.Record(true)
	if b.State() != BreakerClosed {
		t.Fatalf("after a successful trial: state %v, want closed", b.State())
	}
	// Closed again with a fresh count: one failure does not reopen a threshold-2 breaker.
	fail(t, b, 1)
	if b.State() != BreakerClosed {
		t.Errorf("one failure after recovery reopened the breaker")
	}
	for range 5 {
		if !b.Acquire() {
			t.Fatal("closed breaker refused a request")
		}
	}
}

func TestBreakerTrialFailureReopens(t *testing.T) {
	b, clk := inTrial(t, 5, time.Minute)
	b.Record(false) // a single failure suffices in half-open, whatever the threshold
	if b.State() != BreakerOpen || b.Allows() {
		t.Fatalf("after a failed trial: state %v, want open", b.State())
	}
	// The new open period runs from the trial's failure.
	checkOpenFor(t, b, clk, time.Minute)
}

func TestBreakerAbandonFreesTheTrial(t *testing.T) {
	b, _ := inTrial(t, 1, time.Minute)
	b.Abandon()
	if b.State() != BreakerHalfOpen {
		t.Errorf("Abandon changed the state to %v", b.State())
	}
	if !b.Allows() || !b.Acquire() {
		t.Error("after Abandon the half-open breaker does not offer the trial again")
	}
	if b.Acquire() {
		t.Error("after Abandon two trials went through")
	}
}

func TestBreakerDisabledAlwaysAllows(t *testing.T) {
	b := NewBreaker(1, time.Hour, true)
	for range 100 {
		if !b.Acquire() {
			t.Fatal("disabled breaker refused a request")
		}
		b.Record(false)
	}
	if b.State() != BreakerClosed || !b.Allows() {
		t.Errorf("disabled breaker state %v", b.State())
	}
	b.Abandon()
}

func TestNilBreakerAllows(t *testing.T) {
	var b *Breaker
	if !b.Allows() || !b.Acquire() || b.State() != BreakerClosed {
		t.Error("nil breaker does not allow")
	}
	b.Record(false)
	b.Abandon()
}

func TestBreakerStateString(t *testing.T) {
	for s, want := range map[BreakerState]string{BreakerClosed: "closed", BreakerOpen: "open", BreakerHalfOpen: "half_open"} {
		if s.String() != want {
			t.Errorf("%d.String() = %q, want %q", int(s), s.String(), want)
		}
	}
}
