package sim

import (
	"context"
	"sync"
	"time"
)

// Clock is the worker's source of time. The worker measures queueing with
// Now and paces prefill and decoding with Sleep.
type Clock interface {
	Now() time.Time
	// Sleep waits for d or until ctx is done, whichever comes first, and
	// returns ctx.Err() in the second case.
	Sleep(ctx context.Context, d time.Duration) error
}

// wallClock is the real clock.
type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

func (wallClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ManualClock is a Clock whose time moves only when Advance is called, so a
// test can hold requests at a known point and read exact simulated
// durations. It is safe for concurrent use.
type ManualClock struct {
	mu       sync.Mutex
	now      time.Time
	sleepers map[*sleeper]struct{}
}

type sleeper struct {
	ctx   context.Context
	until time.Time
	wake  chan struct{}
}

// NewManualClock returns a ManualClock that reads start.
func NewManualClock(start time.Time) *ManualClock {
	return &ManualClock{now: start, sleepers: make(map[*sleeper]struct{})}
}

// Now returns the clock's current time.
func (c *ManualClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// Sleep blocks until Advance has moved the clock d past the time of the call,
// or ctx is done.
func (c *ManualClock) Sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	c.mu.Lock()
	s := &sleeper{ctx: ctx, until: c.now.Add(d), wake: make(chan struct{})}
	c.sleepers[s] = struct{}{}
	c.mu.Unlock()
	select {
	case <-s.wake:
		return nil
	case <-ctx.Done():
		c.mu.Lock()
		delete(c.sleepers, s)
		c.mu.Unlock()
		return ctx.Err()
	}
}

// Advance moves the clock forward by d and wakes every sleeper that is due.
func (c *ManualClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
	for s := range c.sleepers {
		if !s.until.After(c.now) {
			delete(c.sleepers, s)
			close(s.wake)
		}
	}
}

// Sleepers returns the number of goroutines blocked in Sleep whose context is not done. A
// sleeper whose context was cancelled is about to return, whether or not its goroutine has
// run yet, so it is not counted: a test that advances the clock once every request sleeps
// must not take it for one.
func (c *ManualClock) Sleepers() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for s := range c.sleepers {
		if s.ctx.Err() == nil {
			n++
		}
	}
	return n
}
