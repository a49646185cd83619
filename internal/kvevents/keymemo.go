package kvevents

import (
	"slices"
	"sync"
)

// KeyMemo gives the keys of a prompt's tokens (Keys) remembering the keys of recent prompts, so
// that a prompt that begins with one of them hashes only what follows it. An agent's turn resends
// the conversation and appends to it, and its tokens begin with the earlier turn's: without the
// memo every turn hashed the whole conversation again, 0.4 ms a MiB of prompt.
//
// A remembered prompt serves a later one only when its tokens are the later one's first tokens,
// compared in full (about a fifth of what hashing them costs), under the same adapter, cache
// salt and block size. The memo holds at most memoEntries prompts and memoBytes of their tokens
// and keys together (the tokens are mostly the token cache's own, shared), the oldest forgotten
// first. Safe for concurrent use; the keys it returns are shared and must not be changed.
type KeyMemo struct {
	mu      sync.Mutex
	entries []memoEntry // oldest first
	bytes   int
}

type memoEntry struct {
	lora, salt string
	blockSize  int
	tokens     []uint32 // the prompt's tokens, whole blocks only
	keys       []uint64
}

// The memo's bounds: enough for the conversations a router has in flight at once, and a scan of
// them costs far less than hashing one block of a long prompt would.
const (
	memoEntries = 64
	memoBytes   = 16 << 20
)

// Keys returns Keys("", lora, salt, tokens, blockSize), hashing only the blocks past the longest
// remembered prompt that tokens begin with, and remembers tokens' keys.
func (m *KeyMemo) Keys(lora, salt string, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return nil
	}
	whole := tokens[:len(tokens)/blockSize*blockSize]
	from := m.longestPrefix(lora, salt, whole, blockSize)
	if from.keys != nil && len(from.keys) == len(whole)/blockSize {
		return from.keys // the same prompt again: a retry, or a turn given the earlier turn's tokens
	}
	keys := make([]uint64, len(from.keys), len(whole)/blockSize)
	copy(keys, from.keys)
	keys = chainKeys(keys, "", lora, salt, whole, blockSize)
	if len(keys) > 0 {
		m.mu.Lock()
		m.remember(memoEntry{lora: lora, salt: salt, blockSize: blockSize, tokens: whole, keys: keys}, from)
		m.mu.Unlock()
	}
	return keys
}

// longestPrefix is the remembered prompt with the most blocks that whole begins with, under the
// same adapter, salt and block size; the zero entry when none. The tokens are compared outside
// the lock, so that turns keyed at once do not wait on each other's comparisons.
func (m *KeyMemo) longestPrefix(lora, salt string, whole []uint32, blockSize int) memoEntry {
	var candidates [memoEntries]memoEntry
	n := 0
	m.mu.Lock()
	for _, e := range m.entries {
		// The last token first: most prompts that are not a prefix differ there.
		if l := len(e.tokens); l <= len(whole) && e.blockSize == blockSize && e.lora == lora && e.salt == salt && e.tokens[l-1] == whole[l-1] {
			candidates[n] = e
			n++
		}
	}
	m.mu.Unlock()
	var best memoEntry
	for _, e := range candidates[:n] {
		if len(e.tokens) > len(best.tokens) && slices.Equal(e.tokens, whole[:len(e.tokens)]) {
			best = e
		}
	}
	return best
}

// remember keeps e in place of from, the entry it extends if any (e serves every prompt from
// would, and a conversation takes one entry, not one a turn), and forgets the oldest entries past
// the bounds. m.mu is held.
func (m *KeyMemo) remember(e, from memoEntry) {
	size := entryBytes(e)
	if size > memoBytes/4 {
		return // one prompt may not take over the memo
	}
	if len(from.keys) > 0 {
		if i := slices.IndexFunc(m.entries, func(old memoEntry) bool { return &old.keys[0] == &from.keys[0] }); i >= 0 {
			m.bytes -= entryBytes(m.entries[i])
			m.entries = slices.Delete(m.entries, i, i+1)
		}
	}
	for len(m.entries) > 0 && (len(m.entries) >= memoEntries || m.bytes+size > memoBytes) {
		m.bytes -= entryBytes(m.entries[0])
		m.entries = slices.Delete(m.entries, 0, 1)
	}
	m.entries = append(m.entries, e)
	m.bytes += size
}

func entryBytes(e memoEntry) int { return 4*len(e.tokens) + 8*len(e.keys) }
