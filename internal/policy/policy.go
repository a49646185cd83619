// Package policy chooses a worker for a request. A Policy is pure logic over the request's keys and
// the candidate workers' state; it does no I/O. This package holds the interface and the baseline
// policies (one file each); the cache-aware policy lives in policy/cacheaware.
package policy

import (
	"context"
	"fmt"
	"math/rand/v2"

	"github.com/cacheroute/cacheroute/internal/reqkey"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Input is what a policy sees for one request.
type Input struct {
	// Context bounds any store access the policy makes (a shared session store); never nil when
	// the proxy calls.
	Context context.Context
	Request *reqkey.Request
	// Candidates are the tenants that may take the request (healthy, breaker closed, serving the
	// model, not yet tried for this request). Never empty.
	Candidates []*workers.Worker
	// All is every registered tenant, candidate or not, for policies whose mapping must not move
	// when a worker is briefly unavailable (the hash ring).
	All []*workers.Worker
}

// Decision is a policy's choice and why it was made.
type Decision struct {
	Worker *workers.Worker
	// Label names the reason, echoed in x-vllm-router-decision; baseline policies use their name.
	Label string
	// Match is the predicted fraction of the request's routing text the chosen worker holds in
	// cache, or 0 when the policy does not know.
	Match float64
}

// Policy selects one of the candidates.
type Policy interface {
	Name() string
	Select(in Input) Decision
}

// WorkerRemovalListener is implemented by policies that keep per-worker state; the router calls
// it when a worker URL (all its ranks) leaves the pool.
type WorkerRemovalListener interface {
	WorkerRemoved(url string)
}

// New returns the baseline policy called name. cache_aware is built by its own package.
func New(name string) (Policy, error) {
	switch name {
	case "random":
		return Random{}, nil
	case "round_robin":
		return &RoundRobin{}, nil
	case "power_of_two":
		return PowerOfTwo{}, nil
	case "consistent_hash":
		return NewConsistentHash(), nil
	case "rendezvous_hash":
		return Rendezvous{}, nil
	}
	return nil, fmt.Errorf("unknown policy %q", name)
}

// LeastLoaded returns the candidate with the fewest requests in flight. Ties are broken uniformly
// at random (reservoir sampling over the tied), never by position: picking the first of equals
// would send every request of an idle fleet to the same worker.
func LeastLoaded(candidates []*workers.Worker) *workers.Worker {
	var best *workers.Worker
	var bestLoad int64
	ties := 0
	for _, w := range candidates {
		load := w.Load()
		switch {
		case best == nil || load < bestLoad:
			best, bestLoad, ties = w, load, 1
		case load == bestLoad:
			ties++
			if rand.IntN(ties) == 0 {
				best = w
			}
		}
	}
	return best
}
