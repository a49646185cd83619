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
	// RoleDPSize gives the workers of a role their own ranks per URL, in place of DPSize
	// (prefill and decode engines are often scaled apart: prefill at DP 4, decode at DP 2).
	RoleDPSize map[Role]int

	// LoadSignal is what Worker.Load returns: SignalRequests (the default when empty),
	// SignalTokens or SignalEngine.
	LoadSignal string
	// LoadUnitTokens is the prompt tokens worth one request in flight, for the tokens signal
	// (DefaultLoadUnitTokens when 0).
	LoadUnitTokens int
	// EngineMaxAge is how long scraped engine figures are routed on after their scrape began
	// (EngineMaxAge(interval) is the rule; 1s when 0).
	EngineMaxAge time.Duration
	// KVCapacityTokens, when positive, is every tenant's KV capacity in tokens whatever its
	// engine's page says (Worker.SetKVCapacity).
	KVCapacityTokens int64
}

// Pool is the set of workers. Reads (every routed request) take an immutable snapshot without
// locking; membership changes (admin API, startup) copy the list under a mutex.
type Pool struct {
	opts Options
	lc   *loadConfig

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
	lc := &loadConfig{signal: signalRequests, unitTokens: DefaultLoadUnitTokens, maxAge: opts.EngineMaxAge}
	switch opts.LoadSignal {
	case SignalTokens:
		lc.signal = signalTokens
	case SignalEngine:
		lc.signal = signalEngine
	}
	if opts.LoadUnitTokens > 0 {
		lc.unitTokens = int64(opts.LoadUnitTokens)
	}
	if lc.maxAge <= 0 {
		lc.maxAge = time.Second
	}
	p := &Pool{opts: opts, lc: lc}
	p.snapshot.Store(&[]*Worker{})
	return p
}

// LoadSignal is the signal Worker.Load follows (SignalRequests, SignalTokens or SignalEngine).
func (p *Pool) LoadSignal() string {
	switch p.lc.signal {
	case signalTokens:
		return SignalTokens
	case signalEngine:
		return SignalEngine
	}
	return SignalRequests
}

// All returns every tenant, in registration order. The slice must not be modified.
func (p *Pool) All() []*Worker { return *p.snapshot.Load() }

// Add registers url as one colocated tenant, or DPSize tenants with data parallelism. New
// tenants start unhealthy; the health checker's first probe decides.
func (p *Pool) Add(url string) ([]*Worker, error) { return p.AddAs(url, RoleColocated) }

// AddAs registers url in role: one tenant, or a tenant per data-parallel rank (the role's
// RoleDPSize, else DPSize). Its tenants have the role before any request can see them; they start
// unhealthy, and the health checker's first probe decides.
func (p *Pool) AddAs(url string, role Role) ([]*Worker, error) {
	ranks := p.opts.DPSize
	if n := p.opts.RoleDPSize[role]; n >= 1 {
		ranks = n
	}
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
	if ranks == 1 {
		added = []*Worker{newWorker(url, -1, 1, breaker, p.lc)}
	} else {
		for r := range ranks {
			added = append(added, newWorker(url, r, ranks, breaker, p.lc))
		}
	}
	for _, w := range added {
		w.SetRole(role)
		if p.opts.KVCapacityTokens > 0 {
			w.SetKVCapacity(p.opts.KVCapacityTokens)
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
// not open) and serving it, and the served model the request's state belongs to.
//
// The model rule: state (prefix trees, sessions, metric series) is kept only under a model a
// healthy worker serves, as the workers' own /v1/models lists say, so that no client can create
// it for a model nobody serves. known is false for any other name: the caller either answers
// 404, as a worker would, or forwards the request to every available tenant, keeping its state
// under no model. An empty model goes to every available tenant and, on a one-model
// fleet, belongs to that model. Workers that list no models (their /v1/models failed) serve any
// name; requests that only they can take belong to no model (served is "").
func (p *Pool) Candidates(model string) (candidates []*Worker, served string, known bool) {
	all := p.All()
	if model == "" {
		if models := p.Models(); len(models) == 1 {
			served = models[0]
		}
		for _, w := range all {
			if w.Available() {
				candidates = append(candidates, w)
			}
		}
		return candidates, served, true
	}
	anyHealthy := false
	for _, w := range all {
		healthy := w.Healthy()
		anyHealthy = anyHealthy || healthy
		if !w.Serves(model) {
			continue
		}
		if healthy {
			known = true
			if len(w.Models()) > 0 {
				served = model
			}
		}
		if w.Available() {
			candidates = append(candidates, w)
		}
	}
	if !known && anyHealthy {
		return nil, "", false
	}
	// With no healthy worker at all the answer is 503 (nobody can serve), not 404.
	return candidates, served, true
}
