package kvcache

// changes.go records what happens to the cache's blocks, for a worker that publishes KV-cache
// events as vLLM does: a block becoming computed (a hit for later requests from then on), a
// computed block evicted to make room, the whole cache emptied. Recording is off by default and
// costs nothing then; a worker that publishes turns it on and takes the changes after each call
// that can make them (Acquire, Computed, Commit, Reset), while it still serialises calls.

// ChangeKind is what happened to a block.
type ChangeKind uint8

const (
	// Stored: the block became computed. Pos is its place in the stream the call was about
	// (the prompt's blocks for Computed, prompt and reply for Commit), so the caller can find
	// its tokens and the block before it.
	Stored ChangeKind = iota + 1
	// Evicted: a computed block left the cache to make room for another.
	Evicted
	// Cleared: Reset emptied the cache.
	Cleared
)

// Change is one recorded change.
type Change struct {
	Kind ChangeKind
	Hash uint64
	Pos  int // for Stored, the block's index in the call's stream; -1 otherwise
}

// Record turns recording of changes on or off; off drops what was recorded.
func (c *Cache) Record(on bool) {
	c.recording = on
	c.changes = c.changes[:0]
}

// TakeChanges returns the changes recorded since the last call, oldest first. The slice is
// reused by the next call that records: the caller copies what it keeps.
func (c *Cache) TakeChanges() []Change {
	out := c.changes
	c.changes = c.changes[:0]
	return out
}

func (c *Cache) record(kind ChangeKind, hash uint64, pos int) {
	if c.recording {
		c.changes = append(c.changes, Change{Kind: kind, Hash: hash, Pos: pos})
	}
}
