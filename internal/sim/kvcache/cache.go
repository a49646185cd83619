// Package kvcache models the KV block cache of one vLLM engine with automatic
// prefix caching: a fixed number of blocks, a map from chained block hash to
// block, pins held by running requests, and least-recently-used eviction of
// the blocks no running request holds.
//
// The model is pure logic with no clock and no locking; the worker that owns
// a Cache serialises calls to it.
package kvcache

import "fmt"

// state of a block.
const (
	stateFree     uint8 = iota // on the free stack, holds nothing
	statePending               // allocated by a request whose prefill has not finished: not a hit yet
	stateComputed              // holds KV for its hash: a hit for later requests
)

// none marks the absence of a block index.
const none = -1

type block struct {
	hash       uint64
	refs       int32 // running requests that pin the block
	prev, next int32 // LRU links, valid while refs == 0 and the block is cached
	state      uint8
	detached   bool // dropped from the map by Reset while pinned: freed on release
}

// Cache is the block cache of one engine. It is not safe for concurrent use.
//
// Every block is in exactly one of three places: the free stack, pinned by at
// least one running request, or on the LRU list (computed, unpinned, ready to
// be hit or evicted). The LRU list runs from the least recently used block
// (evicted first) to the most recently used.
type Cache struct {
	blocks []block
	// index maps a block hash to its block, for pending and computed blocks.
	index  map[uint64]int32
	free   []int32
	sent   int32 // index of the LRU sentinel, len(blocks)-1
	pinned int   // blocks with refs > 0

	evictions int64

	recording bool     // record changes (changes.go)
	changes   []Change // recorded since the last TakeChanges
}

// New returns an empty cache of capacity blocks.
func New(capacity int) *Cache {
	if capacity < 1 {
		panic(fmt.Sprintf("kvcache: capacity %d < 1", capacity))
	}
	c := &Cache{
		blocks: make([]block, capacity+1),
		index:  make(map[uint64]int32, capacity),
		free:   make([]int32, 0, capacity),
		sent:   int32(capacity),
	}
	c.blocks[c.sent].prev, c.blocks[c.sent].next = c.sent, c.sent
	for i := capacity - 1; i >= 0; i-- {
		c.blocks[i].prev, c.blocks[i].next = none, none
		c.free = append(c.free, int32(i))
	}
	return c
}

// Capacity returns the number of blocks the cache holds.
func (c *Cache) Capacity() int { return len(c.blocks) - 1 }

// Resident returns the number of blocks that hold KV (pinned or cached).
func (c *Cache) Resident() int { return c.Capacity() - len(c.free) }

// Pinned returns the number of blocks that running requests hold.
func (c *Cache) Pinned() int { return c.pinned }

// Evictions returns how many cached blocks were evicted to make room.
func (c *Cache) Evictions() int64 { return c.evictions }

// Available returns the number of blocks an allocation can take now: the free ones and the
// computed ones no running request holds (evicted, least recently used first, when taken).
func (c *Cache) Available() int { return c.Capacity() - c.pinned }

// Fits reports whether Acquire(hashes) followed by extra calls to Grow would find every block it
// needs without evicting a block that a running request holds: the prompt's blocks already cached
// (computed or pending) are shared, and the others, plus extra, come out of Available, less the
// cached blocks the prompt itself takes off the LRU list. It is vLLM's admission check: a waiting
// request is scheduled only when its uncached blocks can be allocated.
func (c *Cache) Fits(hashes []uint64, extra int) bool {
	need := extra
	avail := c.Available()
	for _, h := range hashes {
		i, ok := c.index[h]
		switch {
		case !ok:
			need++
		case c.blocks[i].refs == 0:
			avail-- // cached and evictable: the prompt pins it, so nobody else can take it
		}
	}
	return need <= avail
}

// Contains reports whether a computed block with hash h is cached.
func (c *Cache) Contains(h uint64) bool {
	i, ok := c.index[h]
	return ok && c.blocks[i].state == stateComputed
}

// Match returns the number of leading hashes whose blocks are computed and
// cached, without touching anything.
func (c *Cache) Match(hashes []uint64) int {
	n := 0
	for _, h := range hashes {
		if !c.Contains(h) {
			break
		}
		n++
	}
	return n
}

// Pin is the set of blocks one running request holds: those of its prompt's full blocks, in
// prompt order, and the blocks Grow gave it for the tokens after them (the prompt's last partial
// block and the generated tokens), which hold no hash until Commit caches the request's stream.
type Pin struct {
	blocks []int32
	grown  []int32
}

// Len returns the number of blocks p holds.
func (p *Pin) Len() int { return len(p.blocks) + len(p.grown) }

// Grow gives p one more block, for tokens that do not fill a block of the prompt: taken from the
// free stack, or by evicting the least recently used unpinned block. It reports false, and
// changes nothing, when every block is pinned: vLLM then preempts a running request.
func (c *Cache) Grow(p *Pin) bool {
	i := c.take()
	if i == none {
		return false
	}
	c.blocks[i] = block{refs: 1, prev: none, next: none, state: statePending, detached: true}
	c.pinned++
	p.grown = append(p.grown, i)
	return true
}

// Acquire pins the blocks of a prompt whose full-block hashes are hashes and
// returns how many leading blocks were already computed (the cache hit),
// counting at most maxHit of them. Blocks not in the cache are allocated as
// pending, evicting the least recently used unpinned blocks when no block is
// free; when every block is pinned, allocation stops and the rest of the
// prompt is simply not cached.
//
// maxHit exists because an engine always computes at least the last prompt
// token: a prompt of exactly k full blocks can hit at most k-1 of them.
func (c *Cache) Acquire(hashes []uint64, maxHit int) (hit int, p Pin) {
	p.blocks = make([]int32, 0, len(hashes))
	run := true
	for _, h := range hashes {
		i, ok := c.index[h]
		if ok {
			if run && c.blocks[i].state == stateComputed && hit < maxHit {
				hit++
			} else {
				run = false
			}
			c.ref(i)
		} else {
			run = false
			i = c.alloc(h, statePending)
			if i == none {
				break
			}
		}
		p.blocks = append(p.blocks, i)
	}
	return hit, p
}

// Computed marks the blocks of p as holding their KV: the prefill that
// allocated them has finished, so later requests hit them.
func (c *Cache) Computed(p *Pin) {
	for k, i := range p.blocks {
		if b := &c.blocks[i]; b.state == statePending {
			b.state = stateComputed
			if !b.detached {
				c.record(Stored, b.hash, k)
			}
		}
	}
}

// Commit ends a request that finished: the blocks of its prompt (p) and of
// the whole stream it leaves behind (hashes: prompt plus generated reply,
// chained from the first block) are computed and cached, and its pins are
// released. Blocks are released last block first, so within one request the
// tail is evicted before the head, as vLLM does.
//
// The blocks Grow gave p are freed first: the reply's full blocks are cached under their hashes
// in their place.
func (c *Cache) Commit(p *Pin, hashes []uint64) {
	c.unrefAll(p.grown)
	p.grown = nil
	c.Computed(p)
	extra := make([]int32, 0, len(hashes))
	for k, h := range hashes {
		i, ok := c.index[h]
		if ok {
			c.ref(i)
			if c.blocks[i].state == statePending {
				c.record(Stored, h, k)
			}
			c.blocks[i].state = stateComputed
		} else {
			i = c.alloc(h, stateComputed)
			if i == none {
				break
			}
			c.record(Stored, h, k)
		}
		extra = append(extra, i)
	}
	c.unrefAll(extra)
	c.Release(p)
}

// Release unpins the blocks of p without caching more. It is how a request
// that was cancelled or failed gives its blocks back: pending blocks it
// allocated are freed, computed ones become evictable.
func (c *Cache) Release(p *Pin) {
	c.unrefAll(p.grown)
	c.unrefAll(p.blocks)
	p.blocks, p.grown = nil, nil
}

// Reset empties the cache as vLLM's /reset_prefix_cache does: every cached
// block is freed, and blocks that running requests hold stop being hits and
// are freed when released.
func (c *Cache) Reset() {
	for h, i := range c.index {
		b := &c.blocks[i]
		delete(c.index, h)
		if b.refs > 0 {
			b.detached = true
			continue
		}
		c.unlink(i)
		c.release(i)
	}
	c.record(Cleared, 0, -1)
}

// ref pins block i, taking it off the LRU list if it was there.
func (c *Cache) ref(i int32) {
	b := &c.blocks[i]
	if b.refs == 0 {
		c.unlink(i)
		c.pinned++
	}
	b.refs++
}

// unrefAll unpins blocks in reverse order.
func (c *Cache) unrefAll(blocks []int32) {
	for k := len(blocks) - 1; k >= 0; k-- {
		i := blocks[k]
		b := &c.blocks[i]
		b.refs--
		if b.refs > 0 {
			continue
		}
		c.pinned--
		switch {
		case b.detached:
			c.release(i)
		case b.state == statePending:
			delete(c.index, b.hash)
			c.release(i)
		default:
			c.pushMRU(i)
		}
	}
}

// alloc takes a free block, or evicts the least recently used cached one, and
// pins it under hash h. It returns none when every block is pinned.
func (c *Cache) alloc(h uint64, state uint8) int32 {
	i := c.take()
	if i == none {
		return none
	}
	c.blocks[i] = block{hash: h, refs: 1, prev: none, next: none, state: state}
	c.pinned++
	c.index[h] = i
	return i
}

// take removes a block from the free stack, or evicts the least recently used cached one, and
// returns it for the caller to fill; none when every block is pinned.
func (c *Cache) take() int32 {
	if n := len(c.free); n > 0 {
		i := c.free[n-1]
		c.free = c.free[:n-1]
		return i
	}
	i := c.blocks[c.sent].next
	if i == c.sent {
		return none
	}
	c.unlink(i)
	delete(c.index, c.blocks[i].hash)
	c.evictions++
	c.record(Evicted, c.blocks[i].hash, -1)
	return i
}

// release returns block i to the free stack.
func (c *Cache) release(i int32) {
	c.blocks[i] = block{prev: none, next: none}
	c.free = append(c.free, i)
}

func (c *Cache) pushMRU(i int32) {
	s := &c.blocks[c.sent]
	last := s.prev
	c.blocks[i].prev, c.blocks[i].next = last, c.sent
	c.blocks[last].next = i
	s.prev = i
}

func (c *Cache) unlink(i int32) {
	b := &c.blocks[i]
	if b.prev == none {
		return
	}
	c.blocks[b.prev].next = b.next
	c.blocks[b.next].prev = b.prev
	b.prev, b.next = none, none
}
