package cacheaware

import (
	"context"
	"time"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/session"
)

// WorkerRemoved forgets a removed worker URL and every data-parallel rank of it, eagerly: its
// tenants leave the tree and the session store drops the entries pointing at it. url must be in
// the normalised form the pool uses (tenant.NormalizeURL).
func (p *Policy) WorkerRemoved(url string) {
	p.tree.RemoveTenantsWithBase(url)
	_ = p.store.RemoveTenantsWithBase(context.Background(), url)
}

// Run sweeps the state every EvictionInterval until ctx ends: least-recently-used tree leaves
// beyond the budget, expired sessions.
func (p *Policy) Run(ctx context.Context) {
	if p.changes != nil {
		go p.changes.Run(ctx, p.applyChanges)
	}
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

// Responses is the policy's map of stored responses: it shares the session store.
func (p *Policy) Responses() policy.ResponseStore { return p }

// State reports the tree's and the session map's sizes.
func (p *Policy) State() policy.State { return p }

// Sweep runs one eviction pass now.
func (p *Policy) Sweep() {
	p.report(evictedTree, p.tree.Evict())
	if p.sweep != nil {
		p.sweep()
	}
}

// TreeBytes is the heap the prefix tree is charged for, all models together.
func (p *Policy) TreeBytes() int { return p.tree.Bytes() }

// TreeChars is the history stored in the prefix tree, in bytes of text, all models together.
func (p *Policy) TreeChars() int { return p.tree.Chars() }

// Sessions reports the session count of each model, or nil when the store cannot count (a
// shared store). The stored responses' entries, which share the store, are not sessions of any
// model and are left out.
func (p *Policy) Sessions() map[string]int {
	if p.memory == nil {
		return nil
	}
	counts := p.memory.Counts()
	delete(counts, responseNamespace)
	return counts
}

// countSessionEviction feeds the memory store's evictions to the reporter.
func (p *Policy) countSessionEviction(model string, reason session.EvictReason, n int) {
	p.report(reason.String(), n)
}
