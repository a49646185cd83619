package workers

import (
	"sync"
	"time"
)

// BreakerState is closed (traffic flows), open (no traffic) or half-open (one trial request).
type BreakerState int

const (
	BreakerClosed BreakerState = iota
	BreakerOpen
	BreakerHalfOpen
)

func (s BreakerState) String() string {
	switch s {
	case BreakerOpen:
		return "open"
	case BreakerHalfOpen:
		return "half_open"
	default:
		return "closed"
	}
}

// Breaker is a per-worker circuit breaker counting consecutive request failures (connection errors
// and 5xx answers; a 4xx is the client's fault and counts as success). After threshold failures it
// opens for timeout, then lets a single trial request through: success closes it, failure opens it
// again. A nil or disabled Breaker always allows.
type Breaker struct {
	threshold int
	timeout   time.Duration
	disabled  bool
	now       func() time.Time

	mu       sync.Mutex
	state    BreakerState
	failures int
	openedAt time.Time
	trial    bool // a half-open trial request is in flight
}

// NewBreaker returns a closed breaker.
func NewBreaker(threshold int, timeout time.Duration, disabled bool) *Breaker {
	return &Breaker{threshold: threshold, timeout: timeout, disabled: disabled, now: time.Now}
}

// State reports the current state, moving open to half-open once the timeout has passed.
func (b *Breaker) State() BreakerState {
	if b == nil || b.disabled {
		return BreakerClosed
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	return b.state
}

// Allows reports whether a new request may be sent: closed, or half-open with no trial in flight.
// It does not claim the trial; Acquire does, when the request is really sent.
func (b *Breaker) Allows() bool {
	if b == nil || b.disabled {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	return b.state == BreakerClosed || (b.state == BreakerHalfOpen && !b.trial)
}

// Acquire claims permission to send one request; in half-open state only one caller gets it.
func (b *Breaker) Acquire() bool {
	if b == nil || b.disabled {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	switch b.state {
	case BreakerClosed:
		return true
	case BreakerHalfOpen:
		if b.trial {
			return false
		}
		b.trial = true
		return true
	}
	return false
}

// Record reports the outcome of a request sent after Acquire.
func (b *Breaker) Record(success bool) {
	if b == nil || b.disabled {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.advance()
	b.trial = false
	if success {
		b.state, b.failures = BreakerClosed, 0
		return
	}
	b.failures++
	if b.state == BreakerHalfOpen || b.failures >= b.threshold {
		b.state, b.openedAt = BreakerOpen, b.now()
	}
}

func (b *Breaker) advance() {
	if b.state == BreakerOpen && b.now().Sub(b.openedAt) >= b.timeout {
		b.state, b.trial = BreakerHalfOpen, false
	}
}

// Abandon gives back a permission from Acquire whose request ended without a verdict (the client
// went away), so a half-open breaker can try again.
func (b *Breaker) Abandon() {
	if b == nil || b.disabled {
		return
	}
	b.mu.Lock()
	b.trial = false
	b.mu.Unlock()
}
