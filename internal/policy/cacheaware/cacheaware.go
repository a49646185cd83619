// Package cacheaware is the cache_aware routing policy: exact session affinity first, then the
// longest cached prefix of the conversation, then the least-loaded worker, with a load-balance
// gate that overrides all affinity when workers are imbalanced. Every request gets exactly one
// decision label saying which step chose its worker. See docs/cache-aware.md.
package cacheaware

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/prefixtree"
	"github.com/cacheroute/cacheroute/internal/reqkey"
	"github.com/cacheroute/cacheroute/internal/residency"
	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/telemetry"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Decision labels, one per request.
const (
	LabelLoadBalance          = "load_balance"           // the balance gate tripped: least-loaded worker
	LabelSessionMatch         = "session_id_match"       // the session map knew the session's worker
	LabelSessionEvicted       = "session_evicted"        // the session's worker's engine, by its events, holds none of the session: chosen again
	LabelFullHistoryMatch     = "full_history_match"     // unknown session; a worker holds enough of its history
	LabelStaleTenant          = "stale_tenant_fallback"  // unknown session; the history's holder is gone: least-loaded
	LabelHistoryLowMatch      = "full_history_low_match" // unknown session; too little of its history is cached anywhere
	LabelEmptyHistory         = "empty_history_min_load" // unknown session with no text to match: least-loaded
	LabelCacheAffinity        = "cache_affinity"         // no session key; a worker holds enough of the text
	LabelLowMatch             = "low_match_min_load"     // no session key; too little cached anywhere
	LabelFirstHealthyFallback = "first_healthy_fallback" // no session key; the holder is gone: least-loaded (name kept for compatibility)
	LabelKVEventsMatch        = "kv_events_match"        // no session key; the engines' KV-cache events show the worker holding most of the prompt for its load
)

// DefaultModel keys the state of requests that name no model.
const DefaultModel = "default"

// History match modes (Options.HistoryMatchMode).
const (
	// HistoryCost weighs a match that is not a continuation, or that is below the threshold,
	// by the prefill it saves against the load of its holder.
	HistoryCost = "cost"
	// HistoryThreshold ignores a match below the threshold (the RFC's rule).
	HistoryThreshold = "threshold"
)

// bytesPerToken turns bytes of routing text into prompt tokens, roughly, for the cost mode; a
// match counts there in whole blocks of blockBytes (vLLM's default KV block of 16 tokens), since
// an engine caches nothing shorter.
const (
	bytesPerToken = reqkey.BytesPerToken
	blockBytes    = 16 * bytesPerToken
)

// Options are what the policy is built from: its knobs (Knobs, with their flags and defaults)
// and the router's environment (policy.Env).
type Options struct {
	CacheThreshold      float64 // matched fraction strictly above which the holder is chosen
	BalanceAbsThreshold int     // gate: max-min load strictly above this ...
	BalanceRelThreshold float64 // ... and max strictly above min times this
	// HistoryMatchMode is how a match below CacheThreshold counts: HistoryCost weighs the
	// prefill it saves against the holder's load; HistoryThreshold ignores it (the RFC's rule).
	HistoryMatchMode string
	// DisableCorrection keeps the tree's predictions whatever the answers report (Done).
	DisableCorrection bool
	// LoadUnitTokens are the prompt tokens one unit of load is worth, the exchange rate of the
	// cost mode (workers.DefaultLoadUnitTokens when 0).
	LoadUnitTokens   int
	MaxTreeSize      int           // bytes of the one prefix tree, all models together
	EvictionInterval time.Duration // period of the background sweep
	// Store is the session map; nil means an in-process memory store built from SessionTTL and
	// MaxSessions.
	Store       session.Store
	SessionTTL  time.Duration
	MaxSessions int
	// KVIndex, when set, is what the workers' engines report they hold (--kv-events-endpoint);
	// requests that come with their tokens are matched against it before the prefix tree, as
	// CacheIndex says.
	KVIndex *kvevents.Index
	// Tokenizer, when set beside KVIndex, gives the prompt tokens of the requests worth matching
	// against the events (wantsTokens); nil: no request comes with its tokens.
	Tokenizer policy.Tokenizer
	// CacheIndex is which picture of the caches places a request without session key that came
	// with its tokens: IndexAuto (the events when an engine reports holding part of the prompt,
	// else the prefix tree), IndexEvents (the events alone), IndexText (the prefix tree alone).
	// "" is IndexAuto.
	CacheIndex string
	// OffloadedWeight is what a block an engine holds offloaded (its BlockStored medium not the
	// GPU) is worth against a GPU block when the events weigh candidates, 0 to 1.
	OffloadedWeight float64
	// Pressure, when set, places the requests with a session key by what the workers' KV caches
	// can hold once their capacities are known (pressure.go); nil: the chain alone.
	Pressure *PressureOptions
}

// Reporter receives the policy's state events (policy.Reporter).
type Reporter = policy.Reporter

// Policy is the cache_aware policy. It is safe for concurrent use. One prefix tree holds every
// model's conversations, each model in a namespace of its own, so --max-tree-size bounds the whole
// router; the session store likewise holds every model's sessions under one capacity.
type Policy struct {
	policy.Base
	opts  Options
	store session.Store
	// changes shares the residency model's changes with the other replicas: set when the store
	// is a shared one that broadcasts (Redis) and the pressure model is on.
	changes  *session.Broadcast
	memory   *session.Memory // the store when it is the memory one; nil otherwise
	sweep    func() int      // drops expired local sessions; nil when the store has none
	reporter Reporter
	log      *slog.Logger
	tree     *prefixtree.Tree
	blocks   *sessionBlocks   // the first block of each session's last turn, for the events' check
	pressure *pressure        // nil: the pressure-aware placement is off
	spares   sync.Pool        // of *[]prefixtree.Hold: arrays the probes of a large fleet borrow (probe)
	keys     kvevents.KeyMemo // the event keys of recent prompts, which their next turns extend
}

// New returns the policy. r may be nil (nothing reported).
func New(opts Options, r Reporter, log *slog.Logger) *Policy {
	if opts.LoadUnitTokens <= 0 {
		opts.LoadUnitTokens = workers.DefaultLoadUnitTokens
	}
	p := &Policy{opts: opts, reporter: r, log: log, tree: prefixtree.New(opts.MaxTreeSize),
		blocks: newSessionBlocks(opts.MaxSessions)}
	if o := opts.Pressure; o != nil {
		ro := o.Residency
		ro.MaxSessions = opts.MaxSessions
		if b, ok := opts.Store.(broadcaster); ok {
			p.changes = b.Broadcast("residency")
			ro.OnChange = func(c residency.Change) { p.changes.Send(c.Append(nil)) }
		}
		o.Residency = ro
		p.pressure = newPressure(*o)
	}
	if opts.Store != nil {
		p.store = opts.Store
		if s, ok := opts.Store.(interface{ Sweep() int }); ok {
			p.sweep = s.Sweep // a shared store's local fallback map
		}
	} else {
		p.memory = session.NewMemory(session.MemoryOptions{
			TTL:        opts.SessionTTL,
			MaxEntries: opts.MaxSessions,
			OnEvict:    p.countSessionEviction,
		})
		p.store = p.memory
		p.sweep = p.memory.Sweep
	}
	if r != nil {
		// Every kind of eviction is reported once, as none, from the start: its counter then has
		// a series, at 0, for rate() and alerts before the first eviction.
		for _, kind := range evictionKinds {
			r.Evicted(kind, 0)
		}
	}
	return p
}

// evictionKinds are every kind of state the policy reports evicted: bytes of the prefix tree, and
// sessions by the reason they went.
var evictionKinds = []string{evictedTree, session.SessionTTL.String(), session.SessionCapacity.String(), session.WorkerRemoved.String()}

// evictedTree is the kind of prefix-tree bytes evicted.
const evictedTree = "tree"

// Name is the policy's --policy name.
const Name = "cache_aware"

func (p *Policy) Name() string { return Name }

// Labels lists every label the policy gives, for the per-label decision counter: derived from
// the labels each step of the chain, and the paths beside it, declare (labels).
func (p *Policy) Labels() []string { return slices.Clone(labels) }

func (p *Policy) report(kind string, n int) {
	if p.reporter != nil && n > 0 {
		p.reporter.Evicted(kind, n)
	}
}

// decision is the chain's working state for one request.
type decision struct {
	in policy.Input
	// prompt is the request's prompt tokens, when asked for this request (askTokens, in Select;
	// Accepted reads them back from the request's memo); the zero Prompt otherwise.
	prompt  policy.Prompt
	ctx     context.Context
	model   string
	text    string // the request's history key or routing text; in the tree under model
	key     string // session key; "" when the request has none or is not a chat
	minLoad int64
	maxLoad int64
	forget  []tenant.ID // tenants found gone while choosing, dropped at Accepted
	// eventsHeld is the prompt tokens the chosen worker holds by its KV-cache events, when the
	// events chose it (LabelKVEventsMatch, LabelSessionEvicted).
	eventsHeld int
	// probe is the decision's one reading of the prefix tree for text (empty when there is no
	// text): every step and the decision itself read the tree through it.
	probe prefixtree.Probe
	spare *[]prefixtree.Hold // the array the probe borrowed from Policy.spares; nil when none
	// session is the candidate the session map names (sessionWorker), once sessionLooked.
	session       *workers.Worker
	sessionLooked bool
}

// newDecision derives the chain's keys from the input; Select, Accepted and Done derive the same ones.
func newDecision(in policy.Input) *decision {
	req := in.Request
	d := &decision{in: in, ctx: in.Context, model: in.Model, text: req.Text}
	if d.ctx == nil {
		d.ctx = context.Background()
	}
	if d.model == "" {
		d.model = DefaultModel
	}
	if req.Chat {
		d.key = req.SessionKey
	}
	if req.PreviousResponseID != "" {
		// The input of a turn that continues a stored response holds only the new items: it is
		// no history to match or to teach.
		d.text = ""
	}
	return d
}

// Select runs the decision chain. It changes no learned state: what the choice teaches is
// recorded by Accepted, once the proxy has accepted the worker. The one thing it writes is the
// pressure model's claim on a new session's worker (claims.go), a hint that Accepted ends and
// that lapses by itself.
func (p *Policy) Select(in policy.Input) policy.Decision {
	d := newDecision(in)
	p.askTokens(in, d)
	if id := in.Request.PreviousResponseID; id != "" {
		if dec, ok := p.followResponse(d, id); ok {
			return dec
		}
	}
	if p.pressure.active(d) {
		return p.place(d)
	}
	d.minLoad, d.maxLoad = loadRange(in.Candidates)
	p.probe(d)

	w, label, step := p.choose(d)
	chosen := d.probe.Of(w.ID())
	held, heldAge := chosen.Held, chosen.Age
	match := 0.0
	switch {
	case d.eventsHeld > 0:
		// The engine's own account: the share of the prompt's tokens it holds; the held bytes stay the
		// tree's, which is what Done undoes on a failure.
		match = float64(d.eventsHeld) / float64(len(d.prompt.Tokens))
	case len(d.text) > 0:
		match = float64(held) / float64(len(d.text))
	}
	if p.log.Enabled(d.ctx, slog.LevelDebug) {
		p.log.Debug("cache_aware decision", "decision", label, "step", step, "worker", w.Name(), "match", match,
			"min_load", d.minLoad, "max_load", d.maxLoad, "session", telemetry.SessionHash(d.key))
	}
	dec := policy.Decision{Worker: w, Label: label, Match: match, Prefill: in.PrefillTokens(held)}
	if held > 0 || len(d.forget) > 0 {
		dec.State = &choice{held: held, heldAge: heldAge, forget: d.forget}
	}
	p.lendBack(d)
	return dec
}

// choice is what a decision remembers for Accepted and Done (policy.Decision.State); nil when
// the chosen worker held nothing and no tenant was found gone.
type choice struct {
	// held is how many bytes of the routing text the chosen worker held before this request, for
	// Done to undo what Accepted taught if the attempt fails.
	held int
	// heldAge is how old the prefix the chosen worker held was, in bytes the tree had taught that
	// worker since it last used it, so that feedback can tell how far back the worker's cache
	// reaches. Meaningful only when held > 0.
	heldAge uint64
	// forget are tenants found gone or unavailable while choosing; Accepted drops their state,
	// so that Select itself changes nothing.
	forget []tenant.ID
	// session is the pressure model's record of the decision; nil when it did not place it.
	session *sessionRecord
}

// choiceOf is the decision's record, or the zero one.
func choiceOf(d policy.Decision) choice {
	if c, ok := d.State.(*choice); ok {
		return *c
	}
	return choice{}
}

// Accepted teaches the accepted choice: the session entry points at the chosen worker (a session
// hit only refreshes it, which the lookup already did), the chosen worker now holds the request's
// text, and the tenants found gone while choosing leave the tree. Session ids never enter the
// tree.
func (p *Policy) Accepted(in policy.Input, dec policy.Decision) {
	if dec.Refusal != nil {
		return // nothing was chosen
	}
	d := newDecision(in)
	d.prompt = in.Asked() // as Select saw them
	for _, t := range choiceOf(dec).forget {
		p.report(evictedTree, p.tree.RemoveTenant(t))
	}
	if d.key != "" && dec.Label != LabelSessionMatch {
		_ = p.store.Set(d.ctx, d.model, d.key, dec.Worker.ID())
	}
	if d.text != "" {
		p.report(evictedTree, p.tree.Insert(d.model, d.text, dec.Worker.ID()))
	}
	p.recordSession(d, dec.Worker)
	if rec := choiceOf(dec).session; rec != nil {
		p.pressure.started(rec, dec.Worker)
	}
}

// FirstByte records the time to first token of a decision the pressure model placed, which Done
// teaches its prediction with once the answer says what the worker computed.
func (p *Policy) FirstByte(_ policy.Input, dec policy.Decision, ttft time.Duration) {
	if rec := choiceOf(dec).session; rec != nil {
		rec.ttft = ttft
	}
}

// Done learns from the end of an attempt: a failure is unlearnt (unlearn), and the cached
// tokens a successful answer reports check the prediction (served).
func (p *Policy) Done(in policy.Input, dec policy.Decision, o workers.Outcome, u policy.Usage) bool {
	if rec := choiceOf(dec).session; rec != nil && dec.Worker != nil {
		p.pressure.ended(in, rec, dec.Worker, o, u)
	}
	switch {
	case o == workers.Failed:
		p.unlearn(in, dec)
	case o == workers.Succeeded && u.Known:
		return p.served(in, dec, u.Prompt, u.Cached)
	}
	return false
}

// unlearn forgets a worker that failed the attempt (unreachable, 5xx, no first byte in time): it
// served nothing, so the session must not stay pinned to it, and the tree must not say it holds
// the request's text: the worker keeps only the bytes it held before Accepted taught it the
// rest, and the next turn does not follow the text there. A retry's Accepted points the session
// and the text at the next worker; after a last failure the next turn chooses afresh. The bytes
// the tree frees are undone, not evicted, so they are not reported. Cancelled and succeeded
// attempts keep what Accepted taught: the worker may well have prefilled the request.
func (p *Policy) unlearn(in policy.Input, dec policy.Decision) {
	d := newDecision(in)
	if d.text != "" {
		p.tree.Release(d.model, d.text, dec.Worker.ID(), choiceOf(dec).held)
	}
	if d.key == "" {
		return
	}
	if worker, ok, err := p.store.Get(d.ctx, d.model, d.key); err == nil && ok && worker == dec.Worker.ID() {
		_ = p.store.Delete(d.ctx, d.model, d.key)
	}
}

// byEvents weighs each candidate by the KV-cache events of its engine: its load plus the prompt
// tokens it would still prefill, in units of LoadUnitTokens, as the cost mode weighs the tree's
// matches; a block its engine holds offloaded saves OffloadedWeight of a GPU block's prefill.
// The cheapest takes the request when it holds part of the prompt; when the cheapest holds none,
// the events decide nothing and the tree is asked. In the auto index one candidate
// comes first: the worker the tree saw this conversation placed on (continuation), while its
// engine holds as much of the prompt as any. Under a small cache every copy is partial, and a
// conversation moved for a little load leaves one partial copy behind and starts another, which
// evicts a third; staying keeps one. A worker whose engine publishes no
// events holds nothing here. The keys carry the request's LoRA adapter, if any (eventKeys), so a
// request matches only blocks computed for its own adapter or base model.
func (p *Policy) byEvents(d *decision) (*workers.Worker, bool) {
	tokens := d.prompt.Tokens
	if p.opts.KVIndex == nil || len(tokens) == 0 {
		return nil, false
	}
	keys := map[int][]uint64{} // by block size
	unit := float64(p.opts.LoadUnitTokens)
	held := make([]int, len(d.in.Candidates))      // tokens of the prompt each engine holds
	worth := make([]float64, len(d.in.Candidates)) // the same, offloaded blocks at their weight
	most := 0.0
	var best *workers.Worker
	bestHeld, bestCost := 0, 0.0
	for i, w := range d.in.Candidates {
		if bs := p.opts.KVIndex.BlockSize(w.ID()); bs > 0 {
			k, ok := keys[bs]
			if !ok {
				k = p.keys.Keys(d.prompt.LoRA, d.prompt.CacheSalt, tokens, bs) // as eventKeys, chained on from an earlier turn's
				keys[bs] = k
			}
			m := p.opts.KVIndex.Match(w.ID(), k)
			held[i] = m.Blocks * bs
			worth[i] = (float64(m.GPUBlocks) + p.opts.OffloadedWeight*float64(m.Blocks-m.GPUBlocks)) * float64(bs)
		}
		most = max(most, worth[i])
		cost := float64(w.Load()) + (float64(len(tokens))-worth[i])/unit
		if best == nil || cost < bestCost || (cost == bestCost && held[i] > bestHeld) {
			best, bestHeld, bestCost = w, held[i], cost
		}
	}
	if most == 0 {
		return nil, false
	}
	// With the tree beside the events, a conversation the tree saw placed stays on its worker
	// while that worker's engine holds as much of it as any: its cache is this conversation's own.
	if p.opts.CacheIndex == IndexAuto && d.text != "" {
		if conversation := p.continuation(d); conversation != nil {
			for i, w := range d.in.Candidates {
				if worth[i] == most && slices.Contains(conversation, w.ID()) {
					d.eventsHeld = held[i]
					return w, true
				}
			}
		}
	}
	if bestHeld == 0 {
		return nil, false
	}
	d.eventsHeld = bestHeld
	return best, true
}

// eventKeys are the index keys of tokens, a prefix of in's prompt, cut at block size bs: chained
// from the root of in's LoRA adapter ("" for a base model), as the index roots each stored block
// at the adapter its BlockStored names, with in's cache_salt in the first block, as vLLM hashes it. The model is "" on both sides: the index keeps each
// worker's blocks apart, and the proxy asks for tokens only of the base model a worker lists
// first and of its adapters.
func eventKeys(prompt policy.Prompt, tokens []uint32, bs int) []uint64 {
	return kvevents.Keys("", prompt.LoRA, prompt.CacheSalt, tokens, bs)
}

func (p *Policy) imbalanced(minLoad, maxLoad int64) bool {
	return maxLoad-minLoad > int64(p.opts.BalanceAbsThreshold) &&
		float64(maxLoad) > float64(minLoad)*p.opts.BalanceRelThreshold
}

// minLoad is the least-loaded candidate.
func (p *Policy) minLoad(d *decision) *workers.Worker { return p.leastLoaded(d, d.in.Candidates) }

// leastLoaded picks the least-loaded of ws. Ties go to the rendezvous-hash winner of the session
// key, so every router replica places a new session on the same idle worker without talking to
// the others; without a session key, ties are broken uniformly at random. Never by position.
func (p *Policy) leastLoaded(d *decision, ws []*workers.Worker) *workers.Worker {
	tied := lowest(ws, func(w *workers.Worker) int64 { return w.Load() })
	if len(tied) == 1 {
		return tied[0]
	}
	if d.key != "" {
		return policy.RendezvousPick(d.key, tied)
	}
	return tied[rand.IntN(len(tied))]
}

// leastLoadedByMatch is the gate's pick: the least-loaded candidate; among equals the one holding
// the longest prefix of the text; then as leastLoaded.
func (p *Policy) leastLoadedByMatch(d *decision) *workers.Worker {
	tied := lowest(d.in.Candidates, func(w *workers.Worker) int64 { return w.Load() })
	if len(tied) > 1 && d.text != "" {
		tied = lowest(tied, func(w *workers.Worker) int64 { return -int64(d.probe.Of(w.ID()).Held) })
	}
	return p.leastLoaded(d, tied)
}

// lowest returns the workers with the smallest score.
func lowest(ws []*workers.Worker, score func(*workers.Worker) int64) []*workers.Worker {
	var out []*workers.Worker
	var best int64
	for _, w := range ws {
		s := score(w)
		switch {
		case len(out) == 0 || s < best:
			out, best = append(out[:0], w), s
		case s == best:
			out = append(out, w)
		}
	}
	return out
}

func loadRange(ws []*workers.Worker) (minLoad, maxLoad int64) {
	for i, w := range ws {
		l := w.Load()
		if i == 0 || l < minLoad {
			minLoad = l
		}
		if i == 0 || l > maxLoad {
			maxLoad = l
		}
	}
	return minLoad, maxLoad
}

func candidate(ws []*workers.Worker, id tenant.ID) *workers.Worker {
	for _, w := range ws {
		if w.ID() == id {
			return w
		}
	}
	return nil
}

// live reports whether tenant is registered and available. A live tenant that is not a
// candidate (already tried by this request, or not serving its model) keeps its state.
func live(all []*workers.Worker, id tenant.ID) bool {
	w := candidate(all, id)
	return w != nil && w.Available()
}
