package cacheaware

import (
	"slices"
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
	by      map[string]claim  // by session key in the residency model
	on      map[tenant.ID]int // the count of live claims on each worker
	// made are the claims in the order they were made, from made[head] on, so that the lapsed
	// ones are found at the front: an entry whose claim was released or made again since is
	// passed over there.
	made []made
	head int
	now  func() time.Time
}

// claim is one placement waiting for Accepted.
type claim struct {
	worker tenant.ID
	at     time.Time
}

// made is one claim as it was made.
type made struct {
	key string
	at  time.Time
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
	return &claims{by: map[string]claim{}, on: map[tenant.ID]int{}, now: now}
}

// add claims worker for the session key.
func (c *claims) add(key string, worker tenant.ID) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	c.expire(now)
	if old, ok := c.by[key]; ok {
		c.drop(key, old)
	} else if len(c.by) >= maxClaims {
		return
	}
	if len(c.made)-c.head >= 2*maxClaims { // mostly released claims waiting to lapse: keep the live ones
		c.made, c.head = c.made[:0], 0
		for k, cl := range c.by {
			c.made = append(c.made, made{k, cl.at})
		}
		slices.SortFunc(c.made, func(a, b made) int { return a.at.Compare(b.at) })
	}
	c.by[key] = claim{worker: worker, at: now}
	c.on[worker]++
	c.made = append(c.made, made{key, now})
}

// release ends the session key's claim: Accepted recorded the session.
func (c *claims) release(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cl, ok := c.by[key]; ok {
		c.drop(key, cl)
	}
}

// onWorker is the count of live claims on worker, in constant time.
func (c *claims) onWorker(worker tenant.ID) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.expire(c.now())
	return c.on[worker]
}

// drop removes the claim cl of key; c.mu is held.
func (c *claims) drop(key string, cl claim) {
	delete(c.by, key)
	if c.on[cl.worker]--; c.on[cl.worker] == 0 {
		delete(c.on, cl.worker)
	}
}

// expire drops the claims that lapsed by now, from the front of made, and moves what is left of
// made to the start of its array once the passed entries are the larger part; c.mu is held.
func (c *claims) expire(now time.Time) {
	for c.head < len(c.made) && now.Sub(c.made[c.head].at) >= claimTTL {
		m := c.made[c.head]
		if cl, ok := c.by[m.key]; ok && cl.at.Equal(m.at) {
			c.drop(m.key, cl)
		}
		c.made[c.head] = made{}
		c.head++
	}
	if c.head > len(c.made)/2 {
		c.made, c.head = append(c.made[:0], c.made[c.head:]...), 0
	}
}
