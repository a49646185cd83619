package cacheaware

import (
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// claims are the new sessions the pressure model has placed whose placement the proxy has not yet
// accepted. The residency model learns a session's worker only at Accepted, so without them a
// burst of new sessions whose Selects run at once would each see the same live counts and all
// go to the one worker each found best; with them, each placement counts on its worker from the
// moment it is chosen. A claim ends when Accepted records the session (started), or lapses after
// claimTTL when the attempt was never made (the breaker refused the worker, the client left).
//
// This is the one thing Select writes, and only a hint: no decision is taught by it, and it
// leaves no trace once it lapses.
type claims struct {
	mu sync.Mutex
	// placing serializes the new-session placements: choosing a worker and claiming it are one
	// step with respect to other placements.
	placing sync.Mutex
	by      map[string]claim // by session key in the residency model
	now     func() time.Time
}

// claim is one placement waiting for Accepted.
type claim struct {
	worker tenant.ID
	at     time.Time
}

const (
	// claimTTL is how long a placement counts without Accepted: far longer than the steps between
	// Select and Accepted (a lease, a breaker check), far shorter than a session's turn gap.
	claimTTL = 2 * time.Second
	// maxClaims bounds the claims: past it, a burst of new sessions is placed without them (as it
	// would be with none), and the router holds no more state for it.
	maxClaims = 4096
)

func newClaims(now func() time.Time) *claims {
	return &claims{by: map[string]claim{}, now: now}
}

// add claims worker for the session key.
func (c *claims) add(key string, worker tenant.ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.by[key]; !ok && len(c.by) >= maxClaims {
		c.expire()
		if len(c.by) >= maxClaims {
			return
		}
	}
	c.by[key] = claim{worker: worker, at: c.now()}
}

// release ends the session key's claim: Accepted recorded the session.
func (c *claims) release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.by, key)
}

// on is the count of live claims on worker.
func (c *claims) on(worker tenant.ID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.by) == 0 {
		return 0
	}
	c.expire()
	n := 0
	for _, cl := range c.by {
		if cl.worker == worker {
			n++
		}
	}
	return n
}

// expire drops the lapsed claims; c.mu is held.
func (c *claims) expire() {
	now := c.now()
	for k, cl := range c.by {
		if now.Sub(cl.at) >= claimTTL {
			delete(c.by, k)
		}
	}
}
