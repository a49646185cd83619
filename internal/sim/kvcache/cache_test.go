package kvcache

import (
	"testing"
)

// seq returns n distinct chained-looking hashes starting at base.
func seq(base uint64, n int) []uint64 {
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = base + uint64(i)
	}
	return hs
}

// run acquires, computes and commits hashes as one finished request.
func run(c *Cache, hashes []uint64) int {
	hit, p := c.Acquire(hashes, len(hashes))
	c.Commit(&p, hashes)
	return hit
}

// probe acquires hashes and releases them at once, returning the blocks that hit.
func probe(c *Cache, hashes []uint64) int {
	hit, p := c.Acquire(hashes, len(hashes))
	c.Release(&p)
	return hit
}

func TestCache_SecondIdenticalPromptHitsAllBlocks(t *testing.T) {
	c := New(64)
	hs := seq(100, 8)
	if hit := run(c, hs); hit != 0 {
		t.Fatalf("first request hit %d blocks, want 0", hit)
	}
	if hit := run(c, hs); hit != 8 {
		t.Fatalf("second request hit %d blocks, want 8", hit)
	}
}

func TestCache_MaxHitCapsTheCount(t *testing.T) {
	c := New(64)
	hs := seq(100, 4)
	run(c, hs)
	hit, p := c.Acquire(hs, 3)
	c.Release(&p)
	if hit != 3 {
		t.Fatalf("hit = %d, want 3 (capped)", hit)
	}
}

func TestCache_HitIsLongestRunFromFirstBlock(t *testing.T) {
	c := New(64)
	run(c, seq(100, 6))
	other := append([]uint64{999}, seq(101, 5)...)
	if hit := probe(c, other); hit != 0 {
		t.Fatalf("prompt differing in block 0 hit %d blocks, want 0", hit)
	}
	partial := append(seq(100, 3), 777, 778)
	if hit := probe(c, partial); hit != 3 {
		t.Fatalf("hit = %d, want 3", hit)
	}
}

func TestCache_PendingBlocksAreNotHits(t *testing.T) {
	c := New(64)
	hs := seq(100, 4)
	_, p1 := c.Acquire(hs, 4) // prefill not finished
	hit, p2 := c.Acquire(hs, 4)
	if hit != 0 {
		t.Fatalf("hit on pending blocks = %d, want 0", hit)
	}
	c.Release(&p1) // the first request is cancelled
	c.Commit(&p2, hs)
	if got := c.Match(hs); got != 4 {
		t.Fatalf("after commit Match = %d, want 4", got)
	}
	if c.Pinned() != 0 {
		t.Fatalf("pinned = %d after all released", c.Pinned())
	}
}

func TestCache_ReleasedPendingBlocksAreFreed(t *testing.T) {
	c := New(8)
	hs := seq(100, 4)
	_, p := c.Acquire(hs, 4)
	c.Release(&p)
	if c.Resident() != 0 || c.Match(hs) != 0 {
		t.Fatalf("cancelled prefill left %d resident blocks, match %d", c.Resident(), c.Match(hs))
	}
}

func TestCache_EvictsLeastRecentlyUsedFirst(t *testing.T) {
	c := New(6)
	a, b, d := seq(100, 2), seq(200, 2), seq(300, 2)
	run(c, a)
	run(c, b)
	run(c, d) // cache full: a (oldest), b, d
	run(c, a) // touch a: b is now the least recently used
	e := seq(400, 2)
	run(c, e) // needs two blocks: evicts b
	if c.Match(b) != 0 {
		t.Fatal("b survived, want it evicted as least recently used")
	}
	for name, hs := range map[string][]uint64{"a": a, "d": d, "e": e} {
		if c.Match(hs) != 2 {
			t.Fatalf("%s evicted, want it kept", name)
		}
	}
	if c.Evictions() != 2 {
		t.Fatalf("evictions = %d, want 2", c.Evictions())
	}
}

func TestCache_TailOfARequestIsEvictedBeforeItsHead(t *testing.T) {
	c := New(4)
	a := seq(100, 4)
	run(c, a)
	run(c, seq(500, 1)) // evicts one block of a: its last
	if got := c.Match(a); got != 3 {
		t.Fatalf("Match(a) = %d, want 3 (tail evicted first)", got)
	}
}

func TestCache_PinnedBlocksAreNeverEvicted(t *testing.T) {
	c := New(4)
	a := seq(100, 4)
	_, pa := c.Acquire(a, 4)
	c.Computed(&pa)
	hit, pb := c.Acquire(seq(200, 2), 2)
	if hit != 0 || pb.Len() != 0 {
		t.Fatalf("allocated %d blocks while all pinned", pb.Len())
	}
	c.Release(&pb)
	if c.Match(a) != 4 {
		t.Fatal("a pinned block was evicted")
	}
	c.Release(&pa)
	run(c, seq(200, 2))
	if c.Match(a) != 2 {
		t.Fatalf("Match(a) = %d, want 2 after two evictions", c.Match(a))
	}
}

func TestCache_CommitCachesTheReplyBlocks(t *testing.T) {
	c := New(64)
	prompt := seq(100, 3)
	stream := seq(100, 6) // prompt blocks then reply blocks
	hit, p := c.Acquire(prompt, 3)
	if hit != 0 {
		t.Fatal("unexpected hit")
	}
	c.Commit(&p, stream)
	next := append(seq(100, 6), 900, 901)
	if hit := probe(c, next); hit != 6 {
		t.Fatalf("next turn hit %d blocks, want 6 (prompt and reply)", hit)
	}
}

func TestCache_ResetEmptiesAndDetachesPinned(t *testing.T) {
	c := New(16)
	a := seq(100, 4)
	run(c, a)
	b := seq(200, 2)
	_, pb := c.Acquire(b, 2)
	c.Computed(&pb)
	c.Reset()
	if c.Match(a) != 0 || c.Match(b) != 0 {
		t.Fatal("blocks survive Reset")
	}
	if c.Resident() != 2 {
		t.Fatalf("resident = %d, want the 2 pinned blocks", c.Resident())
	}
	c.Release(&pb)
	if c.Resident() != 0 || c.Pinned() != 0 {
		t.Fatalf("resident %d pinned %d after release, want 0 0", c.Resident(), c.Pinned())
	}
}

func TestBlockHashes_ChainCoversEarlierBlocks(t *testing.T) {
	text := []byte("aaaabbbbccccdddd")
	ends := []int32{4, 8, 12, 16}
	h1 := BlockHashes(nil, Root(""), text, ends, 2)
	if len(h1) != 2 {
		t.Fatalf("got %d hashes, want 2", len(h1))
	}
	text2 := []byte("xaaabbbbccccdddd")
	h2 := BlockHashes(nil, Root(""), text2, ends, 2)
	if h1[0] == h2[0] || h1[1] == h2[1] {
		t.Fatal("a change in block 0 must change every later hash")
	}
	text3 := []byte("aaaabbbbccccdddx")
	h3 := BlockHashes(nil, Root(""), text3, ends, 2)
	if h1[0] != h3[0] || h1[1] == h3[1] {
		t.Fatal("a change in block 1 must change only block 1 onwards")
	}
	if got := BlockHashes(nil, Root(""), text, ends[:3], 2); len(got) != 1 {
		t.Fatalf("partial trailing block hashed: %d hashes", len(got))
	}
}

func TestBlockHashes_EachAdapterChainsFromARootOfItsOwn(t *testing.T) {
	text := []byte("aaaabbbbccccdddd")
	ends := []int32{4, 8, 12, 16}
	base := BlockHashes(nil, Root(""), text, ends, 2)
	a := BlockHashes(nil, Root("sql-lora"), text, ends, 2)
	b := BlockHashes(nil, Root("chat-lora"), text, ends, 2)
	seen := map[uint64]string{}
	for name, hs := range map[string][]uint64{"base": base, "sql-lora": a, "chat-lora": b} {
		for _, h := range hs {
			if other, ok := seen[h]; ok {
				t.Fatalf("%s and %s share block hash %x", name, other, h)
			}
			seen[h] = name
		}
	}
	if again := BlockHashes(nil, Root("sql-lora"), text, ends, 2); again[1] != a[1] {
		t.Fatal("one adapter's hashes of one text differ between calls")
	}
}
