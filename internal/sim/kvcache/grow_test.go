package kvcache

import "testing"

func TestCache_FitsCountsOnlyTheBlocksNotCachedYet(t *testing.T) {
	c := New(6)
	a := seq(100, 4)
	run(c, a) // 4 cached, evictable
	_, held := c.Acquire(seq(900, 1), 1)
	// 1 pinned elsewhere, 5 available: a's 4 cached blocks and 1 free.
	if !c.Fits(a, 1) {
		t.Fatal("a (cached) plus one grown block does not fit in the free block")
	}
	if c.Fits(a, 2) {
		t.Fatal("a plus two grown blocks fits, but a's own blocks cannot be evicted for them")
	}
	if !c.Fits(seq(200, 5), 0) {
		t.Fatal("five new blocks do not fit in one free and four evictable")
	}
	if c.Fits(seq(200, 6), 0) {
		t.Fatal("six new blocks fit beside a pinned block in a cache of six")
	}
	c.Release(&held)
}

func TestCache_GrowTakesAFreeBlockThenEvictsLRUThenFails(t *testing.T) {
	c := New(3)
	a := seq(100, 1)
	run(c, a) // 1 cached, 2 free
	hit, p := c.Acquire(seq(200, 1), 1)
	if hit != 0 || p.Len() != 1 {
		t.Fatalf("acquire: hit %d, len %d", hit, p.Len())
	}
	if !c.Grow(&p) {
		t.Fatal("grow failed with a free block")
	}
	if c.Match(a) != 1 {
		t.Fatal("grow evicted while a block was free")
	}
	if !c.Grow(&p) {
		t.Fatal("grow failed with an evictable block")
	}
	if c.Match(a) != 0 || c.Evictions() != 1 {
		t.Fatalf("grow did not evict the cached block: match %d, evictions %d", c.Match(a), c.Evictions())
	}
	if c.Grow(&p) {
		t.Fatal("grow succeeded with every block pinned")
	}
	if p.Len() != 3 || c.Pinned() != 3 || c.Available() != 0 {
		t.Fatalf("len %d, pinned %d, available %d; want 3 3 0", p.Len(), c.Pinned(), c.Available())
	}
	c.Release(&p)
	if c.Pinned() != 0 || c.Resident() != 0 {
		t.Fatalf("release left pinned %d, resident %d (the grown blocks hold nothing)", c.Pinned(), c.Resident())
	}
}

func TestCache_CommitTurnsGrownBlocksIntoTheReplysBlocks(t *testing.T) {
	c := New(4)
	prompt := seq(100, 2)
	_, p := c.Acquire(prompt, 2)
	c.Grow(&p)
	c.Grow(&p) // the cache is full: 2 prompt blocks, 2 for the reply's tokens
	c.Commit(&p, seq(100, 4))
	if got := c.Match(seq(100, 4)); got != 4 {
		t.Fatalf("after commit %d blocks of prompt and reply cached, want 4", got)
	}
	if c.Evictions() != 0 || c.Pinned() != 0 {
		t.Fatalf("commit evicted %d, left %d pinned; want 0 0", c.Evictions(), c.Pinned())
	}
}
