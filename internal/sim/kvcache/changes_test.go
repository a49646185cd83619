package kvcache

import (
	"reflect"
	"testing"
)

func TestChanges_NothingIsRecordedUnlessAsked(t *testing.T) {
	c := New(4)
	run(c, seq(1, 3))
	c.Reset()
	if got := c.TakeChanges(); len(got) != 0 {
		t.Fatalf("recorded %v without Record(true)", got)
	}
}

func TestChanges_BlocksAreStoredWhenComputedAndEvictedWhenReused(t *testing.T) {
	c := New(4)
	c.Record(true)
	hs := seq(10, 3)
	hit, p := c.Acquire(hs, len(hs))
	if got := c.TakeChanges(); hit != 0 || len(got) != 0 {
		t.Fatalf("pending blocks recorded as %v", got)
	}
	c.Computed(&p)
	want := []Change{{Stored, 10, 0}, {Stored, 11, 1}, {Stored, 12, 2}}
	if got := c.TakeChanges(); !reflect.DeepEqual(got, want) {
		t.Fatalf("after the prefill %v, want %v", got, want)
	}
	// The reply adds block 13 at position 3; the prompt's blocks are stored already.
	c.Commit(&p, seq(10, 4))
	if got := c.TakeChanges(); !reflect.DeepEqual(got, []Change{{Stored, 13, 3}}) {
		t.Fatalf("after the commit %v", got)
	}
	// Another prompt of two blocks evicts the least recently used: the tail first.
	hit, p = c.Acquire([]uint64{50, 51}, 2)
	want = []Change{{Evicted, 13, -1}, {Evicted, 12, -1}}
	if got := c.TakeChanges(); hit != 0 || !reflect.DeepEqual(got, want) {
		t.Fatalf("evictions %v, want %v", got, want)
	}
	c.Release(&p) // a cancelled prefill: its pending blocks were never stored, nothing to remove
	if got := c.TakeChanges(); len(got) != 0 {
		t.Fatalf("releasing pending blocks recorded %v", got)
	}
	c.Reset()
	if got := c.TakeChanges(); !reflect.DeepEqual(got, []Change{{Cleared, 0, -1}}) {
		t.Fatalf("reset recorded %v", got)
	}
}

func TestChanges_ABlockDetachedByResetIsNotStored(t *testing.T) {
	c := New(4)
	c.Record(true)
	_, p := c.Acquire(seq(1, 2), 2)
	c.Reset() // the running request's pending blocks stop being cache entries
	c.TakeChanges()
	c.Computed(&p)
	if got := c.TakeChanges(); len(got) != 0 {
		t.Fatalf("detached blocks recorded as %v", got)
	}
	c.Release(&p)
}
