package workers

import (
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Options configure the tenants a Pool creates.
type Options struct {
	DPSize                int // ranks per URL; 1 means no data parallelism
	CBFailureThreshold    int
	CBTimeout             time.Duration
	DisableCircuitBreaker bool
}

// Pool is the set of workers. Reads (every routed request) take an immutable snapshot without
// locking; membership changes (admin API, startup) copy the list under a mutex.
type Pool struct {
	opts Options

	mu       sync.Mutex // serialises writers
	snapshot atomic.Pointer[[]*Worker]
}

// ErrExists and ErrNotFound are returned by Add and Remove.
var (
	ErrExists   = errors.New("worker already registered")
	ErrNotFound = errors.New("worker not registered")
)

// NewPool returns an empty pool.
func NewPool(opts Options) *Pool {
	if opts.DPSize < 1 {
		opts.DPSize = 1
	}
	p := &Pool{opts: opts}
	p.snapshot.Store(&[]*Worker{})
	return p
}

// All returns every tenant, in registration order. The slice must not be modified.
func (p *Pool) All() []*Worker { return *p.snapshot.Load() }

// Add registers url as one tenant, or DPSize tenants with data parallelism. New tenants start
// unhealthy; the health checker's first probe decides.
func (p *Pool) Add(url string) ([]*Worker, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := p.All()
	for _, w := range old {
		if w.url == url {
			return nil, ErrExists
		}
	}
	breaker := NewBreaker(p.opts.CBFailureThreshold, p.opts.CBTimeout, p.opts.DisableCircuitBreaker)
	var added []*Worker
	if p.opts.DPSize == 1 {
		added = []*Worker{newWorker(url, -1, breaker)}
	} else {
		for r := range p.opts.DPSize {
			added = append(added, newWorker(url, r, breaker))
		}
	}
	next := append(slices.Clip(old), added...)
	p.snapshot.Store(&next)
	return added, nil
}

// Remove unregisters every tenant of url and returns them.
func (p *Pool) Remove(url string) ([]*Worker, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var kept, removed []*Worker
	for _, w := range p.All() {
		if w.url == url {
			removed = append(removed, w)
		} else {
			kept = append(kept, w)
		}
	}
	if len(removed) == 0 {
		return nil, ErrNotFound
	}
	p.snapshot.Store(&kept)
	return removed, nil
}

// Get returns the tenants of url.
func (p *Pool) Get(url string) []*Worker {
	var out []*Worker
	for _, w := range p.All() {
		if w.url == url {
			out = append(out, w)
		}
	}
	return out
}

// URLs returns each registered worker URL once, in registration order.
func (p *Pool) URLs() []string {
	var out []string
	for _, w := range p.All() {
		if len(out) == 0 || out[len(out)-1] != w.url {
			out = append(out, w.url)
		}
	}
	return out
}

// Models returns the sorted union of models served by healthy workers.
func (p *Pool) Models() []string {
	var out []string
	for _, w := range p.All() {
		if !w.Healthy() {
			continue
		}
		for _, m := range w.Models() {
			if !slices.Contains(out, m) {
				out = append(out, m)
			}
		}
	}
	slices.Sort(out)
	return out
}

// Candidates returns the tenants that may take a request for model: available (healthy, breaker
// not open) and serving it. When the fleet serves a single model, or model is empty, every
// available tenant is a candidate. known reports whether any healthy worker serves model at all,
// so callers can tell "no such model" (404) from "no worker free" (503).
func (p *Pool) Candidates(model string) (candidates []*Worker, known bool) {
	all := p.All()
	filter := model != "" && len(p.Models()) > 1
	known = !filter
	for _, w := range all {
		if filter && !w.Serves(model) {
			continue
		}
		if w.Healthy() {
			known = true
		}
		if w.Available() {
			candidates = append(candidates, w)
		}
	}
	if model != "" && !known {
		return nil, false
	}
	return candidates, true
}
