package cacheaware

import (
	"context"
	"time"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/session"
)

// WorkerRemoved forgets a removed worker URL and every data-parallel rank of it, eagerly: its
// tenants leave every model's tree and the session store drops the entries pointing at it.
func (p *Policy) WorkerRemoved(url string) {
	p.treesMu.RLock()
	for _, t := range p.trees {
		t.RemoveTenantsWithBase(url)
	}
	p.treesMu.RUnlock()
	_ = p.store.RemoveTenantsWithBase(context.Background(), url)
}

// Run sweeps the state every EvictionInterval until ctx ends: least-recently-used tree leaves
// beyond the budget, expired sessions; then it publishes the tree and session gauges.
func (p *Policy) Run(ctx context.Context) {
	t := time.NewTicker(p.opts.EvictionInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			p.Sweep()
		}
	}
}

// Sweep runs one eviction pass now.
func (p *Policy) Sweep() {
	evicted := 0
	p.treesMu.RLock()
	for _, t := range p.trees {
		evicted += t.Evict()
	}
	p.treesMu.RUnlock()
	if evicted > 0 && p.metrics != nil {
		p.metrics.Evictions.WithLabelValues("tree").Add(float64(evicted))
	}
	if p.sweep != nil {
		p.sweep()
	}
}

// State reports each model's tree size and session count, for the metrics.
func (p *Policy) State() []metrics.ModelState {
	p.treesMu.RLock()
	defer p.treesMu.RUnlock()
	out := make([]metrics.ModelState, 0, len(p.trees))
	for model, t := range p.trees {
		s := metrics.ModelState{Model: model, TreeChars: t.Chars(), Sessions: -1}
		if p.memory != nil {
			s.Sessions = p.memory.Len(model)
		}
		out = append(out, s)
	}
	return out
}

// countSessionEviction feeds the memory store's evictions into the metrics.
func (p *Policy) countSessionEviction(model string, reason session.EvictReason, n int) {
	if p.metrics == nil {
		return
	}
	p.metrics.Evictions.WithLabelValues(reason.String()).Add(float64(n))
}
