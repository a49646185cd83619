// Package predict estimates a request's time to first token on each worker: a fixed overhead,
// plus the prompt tokens the worker must compute for it, plus the prompt tokens queued ahead of
// it there, each token at the worker's own prefill rate. The overhead and the rate are learned
// per worker, online, from what the requests it served achieved (their TTFT, and the tokens they
// computed: the prompt less what the answer said was cached), starting from a prior until a
// worker has answered enough.
//
// Placement compares these estimates across workers: a worker holding a conversation's cache
// saves its prefill, one with a long queue costs the wait. Both are in the same unit, so a
// prefix every worker can hold cheaply does not outweigh a queue, and a conversation moves only
// when waiting for its own worker costs more than computing it again elsewhere.
//
// It is pure logic, safe for concurrent use.
package predict

import (
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// Priors, until a worker has taught its own figures: vLLM's prefill on one GPU runs at some
// thousands of tokens a second for models of agent size; the overhead is a scheduling step.
const (
	DefaultPerToken = 100 * time.Microsecond
	DefaultOverhead = 20 * time.Millisecond
)

// weight is the share of each new observation in a worker's figures: about the last 20 requests
// count.
const weight = 0.05

// minTokens is the computed tokens below which an observation teaches the overhead only: its
// TTFT is mostly fixed costs.
const minTokens = 256

// Work is what a request asks of one worker.
type Work struct {
	// Compute is the prompt tokens the worker must compute for the request: its prompt less what
	// the worker holds cached.
	Compute int
	// Ahead is the prompt tokens the worker must compute for requests before it.
	Ahead int
}

// Model holds each worker's learned figures.
type Model struct {
	mu      sync.Mutex
	workers map[tenant.ID]*figures
}

type figures struct {
	perToken float64 // seconds a token
	overhead float64 // seconds
	seen     int
}

// New returns a model with no worker taught yet.
func New() *Model { return &Model{workers: map[tenant.ID]*figures{}} }

func (m *Model) figures(worker tenant.ID) figures {
	if f := m.workers[worker]; f != nil {
		return *f
	}
	return figures{perToken: DefaultPerToken.Seconds(), overhead: DefaultOverhead.Seconds()}
}

// TTFT is the time to first token predicted for w on worker.
func (m *Model) TTFT(worker tenant.ID, w Work) time.Duration {
	m.mu.Lock()
	f := m.figures(worker)
	m.mu.Unlock()
	return f.ttft(w)
}

func (f figures) ttft(w Work) time.Duration {
	return time.Duration((f.overhead + f.perToken*float64(max(w.Compute, 0)+max(w.Ahead, 0))) * float64(time.Second))
}

// PerToken is worker's learned prefill time per token.
func (m *Model) PerToken(worker tenant.ID) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return time.Duration(m.figures(worker).perToken * float64(time.Second))
}

// Observe teaches worker what a request achieved: its TTFT for the work it asked.
func (m *Model) Observe(worker tenant.ID, w Work, ttft time.Duration) {
	if ttft <= 0 {
		return
	}
	secs := ttft.Seconds()
	m.mu.Lock()
	defer m.mu.Unlock()
	f := m.workers[worker]
	if f == nil {
		g := m.figures(worker)
		f = &g
		m.workers[worker] = f
	}
	f.seen++
	tokens := max(w.Compute, 0) + max(w.Ahead, 0)
	if tokens < minTokens {
		f.overhead += weight * (secs - f.overhead)
		f.overhead = max(f.overhead, 0)
		return
	}
	rate := (secs - f.overhead) / float64(tokens)
	if rate <= 0 {
		return // all of it fixed costs, or the overhead is overstated: nothing to say of the rate
	}
	f.perToken += weight * (rate - f.perToken)
}

// Forget drops worker's figures (it left the fleet).
func (m *Model) Forget(worker tenant.ID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.workers, worker)
}
