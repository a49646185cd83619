// Package workers keeps the fleet: each worker tenant's identity, served models, health, circuit
// breaker and in-flight load, the Pool that holds them, and the active health checker.
package workers

import (
	"slices"
	"sync/atomic"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// Worker is one routing target (a tenant). Without data parallelism a worker URL is one tenant;
// with --intra-node-data-parallel-size N it is N tenants "URL@0".."URL@N-1" that share the URL and
// are told apart by the X-data-parallel-rank header.
type Worker struct {
	url   string
	rank  int // -1 without data parallelism
	ranks int // the URL's data-parallel ranks, this one among them (1 without)
	id    tenant.ID
	name  string // id.Redacted(), kept: what clients, logs and metrics see

	role    atomic.Uint32 // a Role (role.go)
	load    atomic.Int64
	healthy atomic.Bool
	drain   atomic.Bool // set by discovery: no new requests, those in flight finish
	stalled atomic.Bool // set by the checker's stall checks (stall.go)
	// progress is the monoNow of the worker's last sign of progress: a byte of an answer, a
	// probe request answered, or the start of an attempt when it had none in flight.
	progress atomic.Int64
	models   atomic.Pointer[[]string]
	adapters atomic.Pointer[map[string]string] // LoRA adapter → its base model, as /v1/models said
	probe    atomic.Pointer[ProbeStatus]       // nil until a health probe fails (see Probe)
	breaker  *Breaker
	lc       *loadConfig // the pool's load signal, shared by its workers

	sent          atomic.Int64                // requests ever sent (Acquire, Reserve): the engine signal's clock
	pendingTokens atomic.Int64                // prompt tokens of attempts not yet prefilled (tokens signal)
	engine        atomic.Pointer[engineState] // last successful scrape with load metrics; nil if none
	lastScrape    atomic.Int64                // monoNow of the last successful scrape's start; 0 if none
	scrapeErrors  atomic.Int64
	kvCapacity    atomic.Int64 // tokens the tenant's KV cache holds, by its engine's page or SetKVCapacity; 0: unknown
	kvCapacitySet atomic.Bool  // SetKVCapacity fixed it: scrapes leave it alone
}

// loadConfig is the part of the pool's Options that Load reads.
type loadConfig struct {
	signal     signal
	unitTokens int64
	maxAge     time.Duration
}

func newWorker(url string, rank, ranks int, breaker *Breaker, lc *loadConfig) *Worker {
	w := &Worker{url: url, rank: rank, ranks: ranks, id: tenant.IDOf(url, rank), breaker: breaker, lc: lc}
	w.name = w.id.Redacted()
	w.models.Store(&[]string{})
	return w
}

// URL is the worker's base URL, the one requests are sent to.
func (w *Worker) URL() string { return w.url }

// Rank is the data-parallel rank, or -1 without data parallelism.
func (w *Worker) Rank() int { return w.rank }

// ID is the worker's one identity: URL, or URL@rank. Every part of the router that keeps
// something per worker keys it by ID.
func (w *Worker) ID() tenant.ID { return w.id }

// Name is the ID as shown outside the router (headers, health, metric labels, logs): the ID
// without any userinfo of its URL (ID.Redacted, computed once).
func (w *Worker) Name() string { return w.name }

// BaseName is the worker URL as shown outside the router, without userinfo.
func (w *Worker) BaseName() string { return tenant.Base(w.name) }

// Load is the tenant's load as the policies balance on it, by the pool's load signal
// (Options.LoadSignal):
//
//   - requests: InFlight.
//   - tokens: InFlight + PendingPrefillTokens / LoadUnitTokens (integer division).
//   - engine: the tenant's share of the worker's running + waiting requests at its last fresh
//     scrape, plus the requests this router sent the tenant since that scrape began; InFlight
//     when there is no fresh scrape (see EngineMaxAge and SetEngine).
//
// It reads atomics only: it is called for every candidate of every request.
func (w *Worker) Load() int64 {
	switch w.lc.signal {
	case signalTokens:
		return w.tokensLoad()
	case signalEngine:
		return w.engineLoad()
	}
	return w.load.Load()
}

// InFlight is the number of requests this router has in flight on the tenant, whatever load
// signal the policies balance on.
func (w *Worker) InFlight() int64 { return w.load.Load() }

// Healthy reports the active health checker's verdict.
func (w *Worker) Healthy() bool { return w.healthy.Load() }

// SetHealthy records a health verdict. The health checker sets it after each probe; tests use it
// to build a fleet without probing.
func (w *Worker) SetHealthy(healthy bool) { w.healthy.Store(healthy) }

// Breaker is the worker's circuit breaker (shared by all ranks of one URL).
func (w *Worker) Breaker() *Breaker { return w.breaker }

// Models are the model ids the worker serves, as its /v1/models said; empty when unknown.
func (w *Worker) Models() []string { return *w.models.Load() }

// Adapter reports whether model is a LoRA adapter the worker serves, and the base model it
// adapts, as its /v1/models said (vLLM's "parent"). A request for an adapter computes KV blocks
// of its own, which never serve the base model or another adapter.
func (w *Worker) Adapter(model string) (base string, ok bool) {
	if a := w.adapters.Load(); a != nil {
		base, ok = (*a)[model]
	}
	return base, ok
}

// Serves reports whether the worker serves model. A worker whose models are unknown serves any.
func (w *Worker) Serves(model string) bool {
	models := w.Models()
	return len(models) == 0 || slices.Contains(models, model)
}

// Draining reports whether the worker is being drained: it takes no new request while the
// requests it has in flight finish (discovery sets it for a pod that is not Ready or is
// terminating). Health checks go on as usual.
func (w *Worker) Draining() bool { return w.drain.Load() }

// SetDraining starts or ends draining.
func (w *Worker) SetDraining(draining bool) { w.drain.Store(draining) }

// Available reports whether the worker may receive a new request: healthy, not stalled, not
// draining, and breaker not open.
func (w *Worker) Available() bool {
	return w.Healthy() && !w.Stalled() && !w.Draining() && w.breaker.Allows()
}

// Reserve counts one more request in flight on w and returns the lease that gives it back. The
// proxy takes load through Pool.Acquire, together with the breaker's permission; Reserve alone is
// for callers that only model load (policy tests and benchmarks).
func (w *Worker) Reserve() *Lease {
	w.busy()
	w.sent.Add(1)
	return &Lease{worker: w}
}

// busy counts one more request in flight; the start of a busy spell counts as progress, so that
// the quiet time before it never makes a worker suspect of a stall.
func (w *Worker) busy() {
	if w.load.Add(1) == 1 {
		w.progress.Store(monoNow())
	}
}

// Lease is one reserved unit of a worker's load. Release gives it back exactly once, however many
// of the paths that end a request (completion, upstream error, client disconnect) call it.
type Lease struct {
	worker   *Worker
	released atomic.Bool
}

// Worker is the leased worker.
func (l *Lease) Worker() *Worker { return l.worker }

// Release returns the load; calls after the first do nothing.
func (l *Lease) Release() {
	if l.released.CompareAndSwap(false, true) {
		l.worker.load.Add(-1)
	}
}
