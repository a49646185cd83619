package cacheaware

import (
	"hash/maphash"
	"sync"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// sessionblocks.go checks a session against the engines' KV-cache events. Per session, the key of
// the first block of its last turn that came with its tokens is kept, with the block size it was
// cut at and the worker the turn went to. Every turn of a conversation extends the one before, so
// that first block is the first block of every later turn too, and the events' index keys blocks
// by a chain from the first: a worker whose engine holds none of it holds none of the session,
// and no prefix of the session can be served from its cache. The keys are the index's own
// (process-seeded), which is why the record is kept here and not in a shared session store.

// sessionBlock is what is kept of a session's last turn.
type sessionBlock struct {
	first     uint64    // the key of its first block, as kvevents.Keys cuts it
	blockSize int       // the block size the key was cut at
	worker    tenant.ID // the worker it went to
	// seen says that the worker's engine has been seen holding that block since. An engine
	// publishes what it stored some milliseconds after storing it, so a block not yet seen may
	// be on its way: only one seen and gone since says that the engine evicted the session.
	seen bool
}

// sessionBlocks maps sessions (by a hash of their model and key) to their sessionBlock. It holds
// at most cap sessions; past that, the one recorded first is forgotten. A forgotten session costs
// one /tokenize on its next turn, which records it again.
type sessionBlocks struct {
	mu   sync.Mutex
	seed maphash.Seed
	cap  int
	byID map[uint64]sessionBlock
	ring []uint64 // ids in the order they were recorded; next overwrites the oldest
	next int
}

func newSessionBlocks(capacity int) *sessionBlocks {
	if capacity <= 0 {
		capacity = session.DefaultMaxEntries
	}
	return &sessionBlocks{seed: maphash.MakeSeed(), cap: capacity, byID: map[uint64]sessionBlock{}}
}

func (s *sessionBlocks) id(model, key string) uint64 {
	var h maphash.Hash
	h.SetSeed(s.seed)
	_, _ = h.WriteString(model)
	_ = h.WriteByte(0)
	_, _ = h.WriteString(key)
	return h.Sum64()
}

func (s *sessionBlocks) get(model, key string) (sessionBlock, bool) {
	id := s.id(model, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.byID[id]
	return b, ok
}

func (s *sessionBlocks) put(model, key string, b sessionBlock) {
	id := s.id(model, key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.byID[id]; !ok {
		if len(s.ring) < s.cap {
			s.ring = append(s.ring, id)
		} else {
			delete(s.byID, s.ring[s.next])
			s.ring[s.next] = id
			s.next = (s.next + 1) % s.cap
		}
	}
	s.byID[id] = b
}

func (s *sessionBlocks) len() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.byID)
}

// eventsChecked reports whether sessions are checked against the events at all.
func (p *Policy) eventsChecked() bool {
	return p.opts.KVIndex != nil && p.opts.CacheIndex != IndexText
}

// firstBlock is the key of the first block of the prompt's tokens at block size bs, if they fill
// one: keyed with its LoRA adapter, as every block of the request is (eventKeys), so an adapter's
// session is checked against its adapter's blocks.
func firstBlock(prompt policy.Prompt, bs int) (uint64, bool) {
	if bs <= 0 || len(prompt.Tokens) < bs {
		return 0, false
	}
	return eventKeys(prompt, prompt.Tokens[:bs], bs)[0], true
}

// sessionEvicted reports whether the events show that w, the worker the session map names, holds
// none of the session: w's engine is known to the index (it reported its block size and its
// stream is synced) and holds no block keyed as the session's first. The key is the request's
// own when it came with its tokens, else the one recorded at the session's last such turn. When
// the engine is unknown, or no key is known, the session map decides as it did without events.
func (p *Policy) sessionEvicted(d *decision, w *workers.Worker) bool {
	if !p.eventsChecked() {
		return false
	}
	bs := p.opts.KVIndex.BlockSize(w.ID())
	first, ok := firstBlock(d.prompt, bs)
	if !ok && len(d.prompt.Tokens) == 0 {
		var b sessionBlock
		b, ok = p.blocks.get(d.model, d.key)
		ok = ok && b.blockSize == bs
		first = b.first
	}
	return ok && p.seenBefore(d, w, first) && !p.holds(w, first)
}

// holds reports whether w's engine holds the block keyed first, by its events.
func (p *Policy) holds(w *workers.Worker, first uint64) bool {
	return p.opts.KVIndex.Match(w.ID(), []uint64{first}).Blocks > 0
}

// seenBefore reports whether the session's record says w's engine was seen holding first.
func (p *Policy) seenBefore(d *decision, w *workers.Worker, first uint64) bool {
	b, ok := p.blocks.get(d.model, d.key)
	return ok && b.seen && b.worker == w.ID() && b.first == first
}

// recordSession keeps the first block of an accepted session turn that came with its tokens, and
// notes on every accepted turn whether the worker's engine has been seen holding it.
func (p *Policy) recordSession(d *decision, w *workers.Worker) {
	if !p.eventsChecked() || d.key == "" {
		return
	}
	bs := p.opts.KVIndex.BlockSize(w.ID())
	if first, ok := firstBlock(d.prompt, bs); ok {
		seen := p.holds(w, first) || p.seenBefore(d, w, first)
		p.blocks.put(d.model, d.key, sessionBlock{first: first, blockSize: bs, worker: w.ID(), seen: seen})
		return
	}
	if bs == 0 && len(d.prompt.Tokens) > 0 {
		// The worker's engine has published nothing yet, so its block size is unknown: the
		// session is recorded without a key, and tokenized again once the engine is known.
		p.blocks.put(d.model, d.key, sessionBlock{worker: w.ID()})
		return
	}
	if b, ok := p.blocks.get(d.model, d.key); ok && !b.seen && b.worker == w.ID() && b.blockSize == bs && p.holds(w, b.first) {
		b.seen = true
		p.blocks.put(d.model, d.key, b)
	}
}

// askTokens gives d, the decision for in, the request's prompt tokens (d.prompt) when it is worth
// them (wantsTokens) and the events are on. A request whose tokens were asked at an earlier
// Select (a retry, after a Hold) keeps them, and is never asked twice (Input.PromptTokens).
func (p *Policy) askTokens(in policy.Input, d *decision) {
	if d.prompt = in.Asked(); p.opts.Tokenizer == nil || p.opts.KVIndex == nil || d.prompt.Tokens != nil {
		return
	}
	if p.wantsTokens(d) {
		d.prompt = in.PromptTokens(p.opts.Tokenizer)
	}
}

// wantsTokens says which requests are worth their prompt tokens (a /tokenize round trip) when
// the events are on: those without any id, which the events place among several candidates; a session this router has no
// first block for (a new session, or one placed by another replica, or forgotten, or one whose
// worker's engine had published nothing when it came, once that engine has), to record it;
// and a session whose worker's engine, by the events, no longer holds its first block, which moves
// and is placed by the events. A session whose worker still holds it, and a turn that continues a
// stored response, are decided without them.
func (p *Policy) wantsTokens(d *decision) bool {
	in := d.in
	switch {
	case in.Request.PreviousResponseID != "":
		return false
	case d.key == "":
		// One candidate takes the request whatever its engine holds.
		return in.Request.SessionKey == "" && len(in.Candidates) > 1
	case !p.eventsChecked():
		return false
	}
	b, ok := p.blocks.get(d.model, d.key)
	if !ok {
		return true
	}
	if b.blockSize == 0 { // recorded before its worker's engine published anything
		return p.opts.KVIndex.BlockSize(b.worker) > 0
	}
	if bs := p.opts.KVIndex.BlockSize(b.worker); bs == 0 || bs != b.blockSize || !b.seen {
		return false // the engine is not known, or has not yet published the block: the session map decides
	}
	return p.opts.KVIndex.Match(b.worker, []uint64{b.first}).Blocks == 0
}
