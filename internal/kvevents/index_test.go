package kvevents

import (
	"encoding/binary"
	"hash/maphash"
	"runtime"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

const bs = 16

// chain stores n blocks of consecutive tokens from start on worker w, hashes base+1 … base+n,
// the first after parent (nil: a sequence's first block).
func chain(t *testing.T, x *Index, w tenant.ID, model string, parent any, base, start, n int, extra ...any) ApplyResult {
	t.Helper()
	hashes := make([]any, n)
	for i := range hashes {
		hashes[i] = base + i + 1
	}
	e := wireStored{hashes: hashes, parent: parent, tokens: seq(start, n*bs), blockSize: bs}
	if len(extra) > 0 {
		e.loraName, e.extraKeys = extra[0], extra[1]
	}
	return x.Apply(w, model, decode(t, encodeArrays(t, nil, e)))
}

func TestIndexMatchesTheStoredPrefixOfARequest(t *testing.T) {
	x := NewIndex(1 << 20)
	if r := chain(t, x, "w1", "m", nil, 0, 0, 3); r.Stored != 3 {
		t.Fatalf("stored %d", r.Stored)
	}
	chain(t, x, "w1", "m", 3, 3, 3*bs, 1) // the next turn's block, after block 3
	request := u32(seq(0, 6*bs+5))        // six full blocks and a partial one
	keys := Keys("m", "", "", request, bs)
	if len(keys) != 6 {
		t.Fatalf("%d keys for six full blocks", len(keys))
	}
	if m := x.Match("w1", keys); m.Blocks != 4 || m.GPUBlocks != 4 {
		t.Fatalf("w1: %+v, want the 4 stored blocks", m)
	}
	if m := x.Match("w2", keys); m.Blocks != 0 {
		t.Fatalf("w2 stored nothing: %+v", m)
	}
	if x.BlockSize("w1") != bs || x.BlockSize("w2") != 0 {
		t.Fatalf("block sizes %d and %d, want %d and 0", x.BlockSize("w1"), x.BlockSize("w2"), bs)
	}
	if m := x.Match("w1", Keys("other-model", "", "", request, bs)); m.Blocks != 0 {
		t.Fatalf("another model's request matched: %+v", m)
	}
	other := u32(seq(0, 6*bs))
	other[bs+3] = 99999 // differs in the second block
	if m := x.Match("w1", Keys("m", "", "", other, bs)); m.Blocks != 1 {
		t.Fatalf("a request differing in block 2: %+v, want 1", m)
	}
}

func TestIndexCreditsNothingAfterAllBlocksCleared(t *testing.T) {
	x := NewIndex(1 << 20)
	chain(t, x, "w1", "m", nil, 0, 0, 4)
	keys := Keys("m", "", "", u32(seq(0, 4*bs)), bs)
	if m := x.Match("w1", keys); m.Blocks != 4 {
		t.Fatalf("before: %+v", m)
	}
	if r := x.Apply("w1", "m", decode(t, encodeMaps(t, nil, wireCleared{}))); !r.Cleared {
		t.Fatal("the clear was not applied")
	}
	if m := x.Match("w1", keys); m.Blocks != 0 || x.Blocks("w1") != 0 || x.Bytes() != 0 {
		t.Fatalf("after AllBlocksCleared: %+v, %d blocks, %d bytes", m, x.Blocks("w1"), x.Bytes())
	}
}

func TestIndexKnowsAClearedEngineStillHoldingNothing(t *testing.T) {
	x := NewIndex(1 << 20)
	chain(t, x, "w1", "m", nil, 0, 0, 2)
	x.Apply("w1", "m", decode(t, encodeMaps(t, nil, wireCleared{})))
	if x.BlockSize("w1") != bs {
		t.Fatalf("block size %d after AllBlocksCleared, want %d: a cleared engine must stay known", x.BlockSize("w1"), bs)
	}
	x.Forget("w1")
	if x.BlockSize("w1") != 0 {
		t.Fatalf("block size %d after Forget, want 0", x.BlockSize("w1"))
	}
}

func TestIndexRunStopsAtARemovedBlock(t *testing.T) {
	x := NewIndex(1 << 20)
	chain(t, x, "w1", "m", nil, 0, 0, 4)
	x.Apply("w1", "m", decode(t, encodeArrays(t, nil, wireRemoved{hashes: []any{2}})))
	if m := x.Match("w1", Keys("m", "", "", u32(seq(0, 4*bs)), bs)); m.Blocks != 1 {
		t.Fatalf("%+v, want the run to end before the removed second block", m)
	}
	if x.Blocks("w1") != 3 {
		t.Fatalf("%d blocks indexed, want 3", x.Blocks("w1"))
	}
}

func TestIndexNeverMatchesAnotherAdaptersBlocks(t *testing.T) {
	x := NewIndex(1 << 20)
	// Both adapters' blocks carry the adapter's name in their extra keys, as vLLM sends them.
	chain(t, x, "w1", "base", nil, 0, 0, 2, "sql", []any{[]any{"sql"}, []any{"sql"}})
	chain(t, x, "w1", "base", nil, 100, 0, 2, "chat", []any{[]any{"chat"}, []any{"chat"}})
	tokens := u32(seq(0, 2*bs))
	for _, c := range []struct {
		lora string
		want int
	}{{"sql", 2}, {"chat", 2}, {"", 0}, {"other", 0}} {
		if m := x.Match("w1", Keys("base", c.lora, "", tokens, bs)); m.Blocks != c.want {
			t.Errorf("a request for adapter %q: %+v, want %d blocks", c.lora, m, c.want)
		}
	}
	x.Apply("w1", "base", decode(t, encodeArrays(t, nil, wireRemoved{hashes: []any{1, 2}})))
	if m := x.Match("w1", Keys("base", "chat", "", tokens, bs)); m.Blocks != 2 {
		t.Fatalf("removing sql's blocks took chat's: %+v", m)
	}
}

func TestIndexSaltedBlocksMatchOnlyTheSameSalt(t *testing.T) {
	x := NewIndex(1 << 20)
	chain(t, x, "w1", "m", nil, 0, 0, 2, nil, []any{[]any{"tenant-a"}, nil})
	tokens := u32(seq(0, 2*bs))
	if m := x.Match("w1", Keys("m", "", "tenant-a", tokens, bs)); m.Blocks != 2 {
		t.Errorf("same salt: %+v", m)
	}
	for _, salt := range []string{"", "tenant-b"} {
		if m := x.Match("w1", Keys("m", "", salt, tokens, bs)); m.Blocks != 0 {
			t.Errorf("salt %q: %+v, want no match", salt, m)
		}
	}
}

func TestIndexCountsOffloadedBlocksApart(t *testing.T) {
	x := NewIndex(1 << 20)
	chain(t, x, "w1", "m", nil, 0, 0, 2)
	// Block 2 is offloaded to CPU, then evicted from the GPU: only the CPU copy is left.
	off := wireStored{hashes: []any{2}, parent: 1, tokens: seq(bs, bs), blockSize: bs, medium: "CPU"}
	x.Apply("w1", "m", decode(t, encodeArrays(t, nil, off, wireRemoved{hashes: []any{2}, medium: "GPU"})))
	if m := x.Match("w1", Keys("m", "", "", u32(seq(0, 2*bs)), bs)); m.Blocks != 2 || m.GPUBlocks != 1 {
		t.Fatalf("%+v, want 2 blocks, 1 on the GPU", m)
	}
}

func TestIndexDoesNotIndexBlocksWhoseParentItNeverSaw(t *testing.T) {
	x := NewIndex(1 << 20)
	r := chain(t, x, "w1", "m", 12345, 0, bs, 2)
	if r.Stored != 0 || r.Orphans != 2 || x.Blocks("w1") != 0 {
		t.Fatalf("%+v with %d blocks indexed, want 2 orphans and none indexed", r, x.Blocks("w1"))
	}
}

// llm-d's simulator sends parent_block_hash 0 for a sequence's first block where vLLM sends nil:
// its blocks are a first block's, not orphans of a block 0 never stored. Every block of such a
// stream was dropped before, and nothing was indexed.
func TestIndexTakesParentZeroForASequencesFirstBlock(t *testing.T) {
	for name, encode := range map[string]func(testing.TB, any, ...any) []byte{"arrays": encodeArrays, "maps": encodeMaps} {
		x := NewIndex(1 << 20)
		first := wireStored{hashes: []any{1, 2}, parent: 0, tokens: seq(0, 2*bs), blockSize: bs, medium: "GPU"}
		next := wireStored{hashes: []any{3}, parent: 2, tokens: seq(2*bs, bs), blockSize: bs, medium: "GPU"}
		r := x.Apply("w1", "m", decode(t, encode(t, nil, first, next)))
		if m := x.Match("w1", Keys("m", "", "", u32(seq(0, 3*bs)), bs)); r.Stored != 3 || r.Orphans != 0 || m.Blocks != 3 {
			t.Errorf("%s: %+v, match %+v: want all 3 blocks indexed and matched", name, r, m)
		}
	}
}

func TestIndexStaysWithinItsBudgetUnderAFlood(t *testing.T) {
	const budget = 500 * perBlockBytes
	x := NewIndex(budget)
	// Three workers store ten times what the budget holds, with removals in between.
	for round := range 50 {
		for w, name := range []tenant.ID{"w1", "w2", "w3"} {
			base := (round*3 + w) * 100
			chain(t, x, name, "m", nil, base, base, 100)
			x.Apply(name, "m", decode(t, encodeArrays(t, nil, wireRemoved{hashes: []any{base + 50}})))
		}
		if x.Bytes() > budget {
			t.Fatalf("round %d: %d bytes, over the budget of %d", round, x.Bytes(), budget)
		}
	}
	total := x.Blocks("w1") + x.Blocks("w2") + x.Blocks("w3")
	if total*perBlockBytes != int(x.Bytes()) || total < 400 {
		t.Fatalf("%d blocks for %d bytes: the count drifted, or the index gave up more than it had to", total, x.Bytes())
	}
	// The newest blocks survive: the last round's chain on w3 still matches in full up to its removed block.
	last := 149 * 100
	if m := x.Match("w3", Keys("m", "", "", u32(seq(last, 100*bs)), bs)); m.Blocks == 0 {
		t.Fatal("the newest blocks were evicted first")
	}
}

// Blocks evicted for the budget leave the eviction order too: under a flood that stores a hundred
// times what the budget holds, the order stays within twice the live blocks, not one place for
// every block ever stored.
func TestIndexEvictionOrderStaysBoundedUnderAFlood(t *testing.T) {
	const live = 500
	x := NewIndex(live * perBlockBytes)
	for round := range 100 {
		base := round * live
		chain(t, x, "w1", "m", nil, base, base, live)
	}
	h := x.workers["w1"]
	if len(h.engine) != live {
		t.Fatalf("%d blocks held, want the budget's %d", len(h.engine), live)
	}
	if len(h.order) > 2*live+64 || cap(h.order) > 8*live+512 {
		t.Fatalf("the eviction order holds %d places (capacity %d) for %d live blocks", len(h.order), cap(h.order), live)
	}
}

// The budget bounds the index's real heap, not only its count, once it is full and evicting under
// a flood: the eviction order and the maps had grown to up to 1.8 times the budget (a Go map keeps
// the slots of the entries deleted from it).
func TestIndexHeapStaysWithinItsBudgetUnderAFlood(t *testing.T) {
	const held = 1 << 14
	tokens := make([]uint32, bs)
	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	x := NewIndex(held * perBlockBytes)
	for i := range 6 * held {
		tokens[0] = uint32(i)
		e := Event{Kind: Stored, BlockHashes: []Hash{Hash(i)}, Parent: Hash(i - 1), HasParent: i%4 != 0, TokenIDs: tokens, BlockSize: bs}
		x.Apply("w1", "m", Batch{Events: []Event{e}})
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if heap := after.HeapAlloc - before.HeapAlloc; x.Blocks("w1") != held || heap > held*perBlockBytes*21/20 {
		t.Fatalf("%d blocks in %d heap bytes, %.2f times the budget of %d", x.Blocks("w1"), heap, float64(heap)/(held*perBlockBytes), held*perBlockBytes)
	}
	runtime.KeepAlive(x)
}

// chainKey hashes a block in one call where it fits its buffer and in runs where it does not: the
// key must be the hash of the same bytes either way, or a long block or a long extra key would
// never match its engine's.
func TestChainKeyHashesTheSameBytesWhateverTheBlocksLength(t *testing.T) {
	for _, extra := range []string{"", "salt", strings.Repeat("x", 600)} {
		for _, n := range []int{0, 1, 16, 125, 126, 127, 128, 200, 1000} {
			tokens := u32(seq(0, n))
			want := binary.LittleEndian.AppendUint64(nil, 42)
			want = append(append(want, extra...), 0)
			for _, tok := range tokens {
				want = binary.LittleEndian.AppendUint32(want, tok)
			}
			if got := chainKey(42, extra, tokens); got != maphash.Bytes(keySeed, want) {
				t.Errorf("extra of %d bytes, %d tokens: the key is not the hash of the block's bytes", len(extra), n)
			}
		}
	}
}
