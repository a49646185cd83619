package workers

import (
	"time"
)

// The load signals a Pool can balance on (Options.LoadSignal).
const (
	// SignalRequests: the requests this router has in flight on the tenant.
	SignalRequests = "requests"
	// SignalTokens: in flight plus the uncached prompt tokens still being prefilled, in units of
	// LoadUnitTokens.
	SignalTokens = "tokens"
	// SignalEngine: the worker's own running and waiting requests from its /metrics, plus what
	// this router sent it since that scrape began.
	SignalEngine = "engine"
)

type signal uint8

const (
	signalRequests signal = iota
	signalTokens
	signalEngine
)

// DefaultLoadUnitTokens is Options.LoadUnitTokens when it is 0.
const DefaultLoadUnitTokens = 1024

// EngineMaxAge is how long a worker's scraped figures stay fresh for a scrape interval: five
// intervals, and at least one second. A scrape that fails, or one that is slow, therefore does
// not drop the signal at once (the next round usually succeeds), while a worker whose scrapes
// keep failing falls back to this router's own in-flight count within a second or so.
func EngineMaxAge(interval time.Duration) time.Duration {
	return max(5*interval, time.Second)
}

// epoch is the origin of the monotonic clock the engine figures are stamped with: time.Since it
// reads the monotonic clock, so a wall-clock step never makes figures fresh or stale.
var epoch = time.Now()

func monoNow() int64 { return int64(time.Since(epoch)) }

// EngineStats are a worker URL's own figures, as its /metrics said: summed over the label sets
// of each metric (several models or engines on one worker), for the whole URL (all its
// data-parallel ranks).
type EngineStats struct {
	Running float64 // requests in the engine's running batches (vllm:num_requests_running, sglang:num_running_reqs)
	Waiting float64 // requests queued in the engine (vllm:num_requests_waiting, sglang:num_queue_reqs)
	// KVCacheUsage is the fraction of the KV cache in use, 0..1 (vllm:kv_cache_usage_perc or the
	// older vllm:gpu_cache_usage_perc, sglang:token_usage), averaged over label sets;
	// meaningful only when HasKVCacheUsage.
	KVCacheUsage    float64
	HasKVCacheUsage bool
	// KVCapacityTokens is the tokens the worker's KV caches hold together (vLLM's
	// cache_config_info num_gpu_blocks × block_size, SGLang's max_total_num_tokens); 0 when its
	// page does not say.
	KVCapacityTokens float64
}

// engineState is one successful scrape of a worker, as a tenant holds it.
type engineState struct {
	stats EngineStats
	share int64 // this tenant's part of running + waiting
	sent  int64 // the tenant's send counter when the scrape began
	at    int64 // monoNow when the scrape began
}

// ScrapeMark is taken by BeginScrape when a scrape of a worker starts: the moment and the count
// of requests sent to the tenant so far, so that the figures the scrape returns are completed by
// exactly the requests the worker may not have seen yet.
type ScrapeMark struct {
	sent int64
	at   int64
}

// BeginScrape marks the start of a scrape of the tenant's worker URL.
func (w *Worker) BeginScrape() ScrapeMark {
	return ScrapeMark{sent: w.sent.Load(), at: monoNow()}
}

// SetEngine records a successful scrape begun at mark. ok false means the worker answered but
// exposes none of the load metrics: the tenant then falls back to its own in-flight count at once.
//
// With data parallelism the figures are the URL's: each rank takes an even share of
// running + waiting (rounded to whole requests; the remainder goes one each to the lowest ranks),
// since the worker's page does not say which rank runs what.
func (w *Worker) SetEngine(mark ScrapeMark, stats EngineStats, ok bool) {
	w.lastScrape.Store(mark.at)
	if !ok {
		w.engine.Store(nil)
		return
	}
	total := int64(stats.Running + stats.Waiting + 0.5)
	if total < 0 {
		total = 0
	}
	share := total
	if n := int64(w.ranks); n > 1 && w.rank >= 0 {
		share = total / n
		if int64(w.rank) < total%n {
			share++
		}
	}
	w.engine.Store(&engineState{stats: stats, share: share, sent: mark.sent, at: mark.at})
	if stats.KVCapacityTokens > 0 && !w.kvCapacitySet.Load() {
		ranks := max(int64(w.ranks), 1)
		w.kvCapacity.Store(int64(stats.KVCapacityTokens) / ranks)
	}
}

// KVCapacity is the tokens the tenant's KV cache holds: as set (SetKVCapacity), else as its
// engine's last page that said (each data-parallel rank an even share of the URL's), else 0 for
// unknown. A capacity once read stays while later pages do not say.
func (w *Worker) KVCapacity() int64 { return w.kvCapacity.Load() }

// SetKVCapacity fixes the tenant's KV capacity in tokens (--kv-capacity-tokens), whatever its
// engine's page says; 0 lets the page say again.
func (w *Worker) SetKVCapacity(tokens int64) {
	w.kvCapacity.Store(max(tokens, 0))
	w.kvCapacitySet.Store(tokens > 0)
}

// ScrapeFailed counts one failed scrape of the tenant's worker URL. The last figures stay in use
// until they are older than the pool's EngineMaxAge.
func (w *Worker) ScrapeFailed() { w.scrapeErrors.Add(1) }

// ScrapeErrors is the number of failed scrapes of the tenant's worker URL.
func (w *Worker) ScrapeErrors() int64 { return w.scrapeErrors.Load() }

// LastScrape is when the last successful scrape of the tenant's worker URL began; ok is false
// when none has succeeded.
func (w *Worker) LastScrape() (at time.Time, ok bool) {
	ns := w.lastScrape.Load()
	if ns == 0 {
		return time.Time{}, false
	}
	return epoch.Add(time.Duration(ns)), true
}

// Engine returns the figures of the last successful scrape that found the load metrics, and
// whether they are fresh enough to route on (see EngineMaxAge). ok is false and stats zero when
// there are none.
func (w *Worker) Engine() (stats EngineStats, fresh bool, ok bool) {
	e := w.engine.Load()
	if e == nil {
		return EngineStats{}, false, false
	}
	return e.stats, monoNow()-e.at <= int64(w.lc.maxAge), true
}

// engineLoad is the engine signal: the tenant's share of the worker's running + waiting at its
// last fresh scrape, plus the requests sent to the tenant since that scrape began; without a
// fresh scrape, this router's own in-flight count.
func (w *Worker) engineLoad() int64 {
	if e := w.engine.Load(); e != nil && monoNow()-e.at <= int64(w.lc.maxAge) {
		return e.share + w.sent.Load() - e.sent
	}
	return w.load.Load()
}

// tokensLoad is the tokens signal: in flight plus the prompt tokens still being prefilled, in
// whole units of LoadUnitTokens.
func (w *Worker) tokensLoad() int64 {
	pending := w.pendingTokens.Load()
	if pending < 0 {
		pending = 0 // a Prefill racing its own release for a moment
	}
	return w.load.Load() + pending/w.lc.unitTokens
}

// PendingPrefillTokens is the uncached prompt tokens of the tenant's attempts whose first byte
// has not arrived yet (see Attempt.Prefill).
func (w *Worker) PendingPrefillTokens() int64 { return max(w.pendingTokens.Load(), 0) }

// Prefill adds tokens, the prompt tokens the worker must prefill for this attempt (those its
// prefix cache is not predicted to hold), to the worker's pending prefill until Prefilled or Close.
// The tokens load signal weighs a worker by them, so a long uncached prompt counts for more
// than a short one while it is being prefilled. Calls after Prefilled or Close do nothing.
func (a *Attempt) Prefill(tokens int) {
	if tokens <= 0 || a.prefilled.Load() {
		return
	}
	a.worker.pendingTokens.Add(int64(tokens))
	a.pending.Add(int64(tokens))
	if a.prefilled.Load() { // Prefilled or Close ran meanwhile and may have missed these
		a.releasePrefill()
	}
}

// Prefilled removes the attempt's pending prefill tokens from the worker: the proxy calls it when
// the worker's first body byte arrives (the prefill is over). Prefilled and Close remove them
// once between them, whichever comes first; further calls do nothing. It is safe to call
// concurrently with Prefill and Close.
func (a *Attempt) Prefilled() {
	a.prefilled.Store(true)
	a.releasePrefill()
}

func (a *Attempt) releasePrefill() {
	if n := a.pending.Swap(0); n != 0 {
		a.worker.pendingTokens.Add(-n)
	}
}
