package kvevents

import (
	"encoding/binary"
	"fmt"
	"hash/maphash"
	"strings"
	"sync"

	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/vmihailenco/msgpack/v5"
)

// index.go keeps, per worker, the blocks its engine reported stored and not yet removed, under
// keys of the router's own. vLLM's block hashes cannot be recomputed outside its process (sha256
// over a pickle, seeded per process), so each BlockStored's tokens are hashed again here, chained
// from the parent block's key, with the model and the LoRA adapter at the root: a request's
// tokens, chained the same way (Keys), give the keys to look up. The engine's hashes are kept
// only to find a block's key again when BlockRemoved names it.
//
// Extra keys. vLLM folds per-block extra inputs into its hashes: the LoRA name, the request's
// cache_salt on its first block, multimodal and prompt-embedding hashes. Here the LoRA name is
// already at the root and is dropped from them; what is left is chained into the key, so a block
// computed with a cache salt matches only a request that gives the same salt, and a block of an
// image matches no request (the router does not know images' hashes): never a false match.

// perBlockBytes is what one indexed block costs in memory: its entry in the engine-hash map and
// in the key map, and its place in the eviction order. BenchmarkIndexBytesPerBlock measured 144
// heap bytes a block over a million blocks stored on 8 workers, and
// BenchmarkIndexBytesPerBlockAtTheBudget 170 once the index is at its budget and evicting (the
// order then holds up to two places a block, and the maps were grown for more entries than they
// hold); the budget counts a little more.
const perBlockBytes = 176

// Match is how much of a request's prefix a worker holds: the run of consecutive blocks from
// the first, and how many of them are on the GPU (the others are offloaded, slower to load).
type Match struct {
	Blocks, GPUBlocks int
}

// Index is what each worker's engine holds. It is safe for concurrent use: events are applied
// under its write lock, lookups take the read lock.
type Index struct {
	mu      sync.RWMutex
	budget  int64 // bytes for all workers together
	used    int64
	workers map[tenant.ID]*held
}

// NewIndex returns an empty index bounded by budget bytes for all workers together; past it, the
// blocks stored longest ago by the worker holding the most are forgotten first.
func NewIndex(budget int64) *Index {
	return &Index{budget: budget, workers: map[tenant.ID]*held{}}
}

type engineKey struct {
	hash      Hash
	group     int32 // not int: the key is 16 bytes, in the engine map and in each place of the order
	offloaded bool
}

func keyOf(hash Hash, offloaded bool, group int) engineKey {
	return engineKey{hash: hash, group: int32(group), offloaded: offloaded}
}

type entry struct {
	key uint64
	seq uint64 // when it was stored, to tell a live entry from an old place in the order
}

// presence counts the engine blocks holding one key, by medium.
type presence struct{ gpu, offloaded uint32 }

// place is a block's place in its worker's store order.
type place struct {
	ek  engineKey
	seq uint64
}

// held is one worker's blocks.
type held struct {
	engine map[engineKey]entry
	keys   map[uint64]presence
	order  []place // store order, oldest first from head; entries removed since are skipped
	head   int
	seq    uint64
	// blockSize is the tokens per block of the worker's last stored blocks: the size a request's
	// keys must be cut in to match them.
	blockSize int
}

func newHeld() *held {
	return &held{engine: map[engineKey]entry{}, keys: map[uint64]presence{}}
}

// ApplyResult counts what applying one batch did.
type ApplyResult struct {
	Stored, Removed int
	// Orphans are stored blocks whose parent the index does not know (evicted from the index, or
	// stored before the router listened): their keys cannot be chained, so they are not indexed.
	Orphans int
	Cleared bool
}

// Apply applies a worker's batch. model is the model the worker serves.
func (x *Index) Apply(worker tenant.ID, model string, b Batch) ApplyResult {
	x.mu.Lock()
	defer x.mu.Unlock()
	h := x.workers[worker]
	if h == nil {
		h = newHeld()
		x.workers[worker] = h
	}
	var res ApplyResult
	for i := range b.Events {
		e := &b.Events[i]
		switch e.Kind {
		case Cleared:
			// The engine is still known, holding nothing: its block size stays, so that a lookup
			// can tell an engine that dropped a prefix from one the router knows nothing of.
			x.used -= int64(len(h.engine)) * perBlockBytes
			bs := h.blockSize
			h = newHeld()
			h.blockSize = bs
			x.workers[worker] = h
			res.Cleared = true
		case Removed:
			for _, hash := range e.BlockHashes {
				if x.remove(h, keyOf(hash, e.Offloaded, e.Group)) {
					res.Removed++
				}
			}
		case Stored:
			n, orphans := x.store(h, model, e)
			res.Stored += n
			res.Orphans += orphans
		}
	}
	x.evict()
	return res
}

func (x *Index) store(h *held, model string, e *Event) (indexed, orphans int) {
	parent := rootKey(model, e.LoRA)
	if e.HasParent {
		p, ok := h.engine[keyOf(e.Parent, e.Offloaded, e.Group)]
		if !ok {
			p, ok = h.engine[keyOf(e.Parent, !e.Offloaded, e.Group)]
		}
		if !ok {
			return 0, len(e.BlockHashes)
		}
		parent = p.key
	}
	bs := e.BlockSize
	if bs > 0 {
		h.blockSize = bs
	}
	for i, hash := range e.BlockHashes {
		if bs <= 0 || bs > len(e.TokenIDs) || i >= len(e.TokenIDs)/bs {
			return indexed, orphans + len(e.BlockHashes) - i // no tokens to key the rest by
		}
		var extra []byte
		if i < len(e.ExtraKeys) {
			extra = e.ExtraKeys[i]
		}
		key := chainKey(parent, extraKey(extra, e.LoRA), e.TokenIDs[i*bs:(i+1)*bs])
		ek := keyOf(hash, e.Offloaded, e.Group)
		x.remove(h, ek) // stored again: its old key, if any, goes
		h.seq++
		h.engine[ek] = entry{key: key, seq: h.seq}
		p := h.keys[key]
		if e.Offloaded {
			p.offloaded++
		} else {
			p.gpu++
		}
		h.keys[key] = p
		h.order = append(h.order, place{ek, h.seq})
		x.used += perBlockBytes
		indexed++
		parent = key
	}
	return indexed, orphans
}

// remove forgets the block of ek, and reports whether there was one.
func (x *Index) remove(h *held, ek engineKey) bool {
	en, ok := h.engine[ek]
	if !ok {
		return false
	}
	delete(h.engine, ek)
	p := h.keys[en.key]
	if ek.offloaded {
		p.offloaded--
	} else {
		p.gpu--
	}
	if p.gpu == 0 && p.offloaded == 0 {
		delete(h.keys, en.key)
	} else {
		h.keys[en.key] = p
	}
	x.used -= perBlockBytes
	h.compact()
	return true
}

// compact drops the places in the order of blocks removed or evicted since (all those before
// head among them), once they outnumber the live ones, so that the order stays within twice the
// live blocks however many were stored: it is rewritten in place, and given back only when it grew
// for far more blocks than are left. The maps are copied afresh too: a Go map keeps the slots of
// the entries deleted from it, and under a flood of stores and evictions the engine map grew to
// four times its entries, its lookups probing through the deleted ones.
func (h *held) compact() {
	if len(h.order) <= 2*len(h.engine)+64 {
		return
	}
	live := h.order[:0]
	if cap(h.order) > 8*len(h.engine)+512 {
		live = make([]place, 0, 2*len(h.engine)+64)
	}
	for _, s := range h.order[h.head:] {
		if en, ok := h.engine[s.ek]; ok && en.seq == s.seq {
			live = append(live, s)
		}
	}
	h.order, h.head = live, 0
	h.engine = copied(h.engine)
	h.keys = copied(h.keys)
}

// copied is m in a map of its own, sized for its entries.
func copied[K comparable, V any](m map[K]V) map[K]V {
	out := make(map[K]V, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// evict forgets blocks, the oldest of the worker holding the most first, until the index is
// within its budget. Forgetting a block the worker still holds only makes the router credit it
// with less than it has.
func (x *Index) evict() {
	for x.used > x.budget {
		var most *held
		for _, h := range x.workers {
			if most == nil || len(h.engine) > len(most.engine) {
				most = h
			}
		}
		if most == nil || len(most.engine) == 0 {
			return
		}
		for most.head < len(most.order) {
			s := most.order[most.head]
			most.head++
			if en, ok := most.engine[s.ek]; ok && en.seq == s.seq {
				x.remove(most, s.ek)
				break
			}
		}
	}
}

// Match returns how many of keys, from the first, the worker holds.
func (x *Index) Match(worker tenant.ID, keys []uint64) Match {
	x.mu.RLock()
	defer x.mu.RUnlock()
	h := x.workers[worker]
	if h == nil {
		return Match{}
	}
	var m Match
	for _, k := range keys {
		p, ok := h.keys[k]
		if !ok {
			break
		}
		m.Blocks++
		if p.gpu > 0 {
			m.GPUBlocks++
		}
	}
	return m
}

// BlockSize is the tokens per block of the worker's engine, from its stored blocks; 0 before the
// first, or since the worker was forgotten. An AllBlocksCleared keeps it: the engine is still
// known, and holds nothing.
func (x *Index) BlockSize(worker tenant.ID) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if h := x.workers[worker]; h != nil {
		return h.blockSize
	}
	return 0
}

// Blocks is the number of blocks indexed for worker.
func (x *Index) Blocks(worker tenant.ID) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	if h := x.workers[worker]; h != nil {
		return len(h.engine)
	}
	return 0
}

// Bytes is the memory the index counts against its budget.
func (x *Index) Bytes() int64 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.used
}

// Forget drops everything indexed for worker: it left the fleet, or its stream can no longer be
// trusted (a sequence gap without replay, a publisher restart).
func (x *Index) Forget(worker tenant.ID) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if h := x.workers[worker]; h != nil {
		x.used -= int64(len(h.engine)) * perBlockBytes
		delete(x.workers, worker)
	}
}

// Keys are the keys of a request's full blocks: its tokens as the engine will see them, cut into
// blocks of blockSize, chained from the root of model and lora (the adapter's name, "" for the
// base model). salt is the request's cache_salt, which vLLM folds into its first block ("" for
// none).
func Keys(model, lora, salt string, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	return chainKeys(make([]uint64, 0, len(tokens)/blockSize), model, lora, salt, tokens, blockSize)
}

// chainKeys appends to keys, the keys of tokens' first len(keys) blocks, the keys of its further
// full blocks, as Keys chains them.
func chainKeys(keys []uint64, model, lora, salt string, tokens []uint32, blockSize int) []uint64 {
	parent := rootKey(model, lora)
	if len(keys) > 0 {
		parent = keys[len(keys)-1]
	}
	for i := len(keys); (i+1)*blockSize <= len(tokens); i++ {
		extra := ""
		if i == 0 {
			extra = salt
		}
		parent = chainKey(parent, extra, tokens[i*blockSize:(i+1)*blockSize])
		keys = append(keys, parent)
	}
	return keys
}

var keySeed = maphash.MakeSeed()

func rootKey(model, lora string) uint64 {
	var h maphash.Hash
	h.SetSeed(keySeed)
	_, _ = h.WriteString(model)
	_ = h.WriteByte(0)
	_, _ = h.WriteString(lora)
	return h.Sum64()
}

// chainKey is the key of the block of tokens that follows the block keyed parent: the hash of
// parent, extra, a zero byte and the tokens as little-endian uint32s. The bytes are laid out in
// one buffer and hashed in one call where they fit, as a block of vLLM's sizes does, and written
// a run at a time otherwise; the hash depends only on the bytes. Writing the tokens one by one
// was most of a long prompt's keying (BenchmarkKeys).
func chainKey(parent uint64, extra string, tokens []uint32) uint64 {
	var buf [512]byte
	b := binary.LittleEndian.AppendUint64(buf[:0], parent)
	b = append(b, extra...)
	b = append(b, 0)
	if len(b)+4*len(tokens) <= len(buf) {
		for _, t := range tokens {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
		return maphash.Bytes(keySeed, b)
	}
	var h maphash.Hash
	h.SetSeed(keySeed)
	_, _ = h.Write(b) // may have moved to the heap, for a long extra
	for len(tokens) > 0 {
		n := min(len(tokens), len(buf)/4)
		b = buf[:0]
		for _, t := range tokens[:n] {
			b = binary.LittleEndian.AppendUint32(b, t)
		}
		_, _ = h.Write(b)
		tokens = tokens[n:]
	}
	return h.Sum64()
}

// extraKey is a block's extra hash inputs as chained into its key: the elements of the engine's
// extra-key tuple other than the LoRA name, each written as text. A cache salt alone gives the
// salt itself, as Keys writes it.
func extraKey(raw []byte, lora string) string {
	if len(raw) == 0 {
		return ""
	}
	var elems []any
	if err := msgpack.Unmarshal(raw, &elems); err != nil {
		return "\x00" + string(raw) // not a tuple: chained as it came, matching no request
	}
	var parts []string
	for _, el := range elems {
		if s, ok := el.(string); ok && s == lora && lora != "" {
			continue
		}
		parts = append(parts, fmt.Sprint(el))
	}
	return strings.Join(parts, "\x00")
}
