package protocol

import (
	"bytes"
	"hash/maphash"
	"slices"
	"sync"
	"sync/atomic"
)

// toolsmemo.go remembers the tools arrays agents send unchanged on every turn. A coding agent's
// tool schemas are tens of KiB of JSON, the same in every request of every session of one agent
// version, and reading them was most of the work of parsing such a body: the lexer checks every
// byte and the history key writes each schema in canonical form. An array met again, byte for
// byte, in a body of the same API is passed over: the scanner adds what checking it added the
// first time, and the history key copies the part it wrote then.
//
// The memo holds at most toolsMemoSlots arrays of at most toolsMemoMaxBytes each (the array and
// its part of the key together), so at most 4 MiB. An array is remembered the second time it is
// met, so that arrays sent once do not displace the ones every turn resends; a full memo gives up
// the entry least recently matched (a second-chance clock).

const (
	toolsMemoSlots    = 16
	toolsMemoMinBytes = 1 << 10   // smaller arrays are read about as fast as they are compared
	toolsMemoMaxBytes = 256 << 10 // an array and its part of the key, together
	toolsMemoSeen     = 64        // arrays met once, remembered by hash until met again
)

// The APIs whose tools the memo holds: the same bytes are read differently by each.
const (
	chatToolsKind byte = 'c' + iota
	responsesToolsKind
	messagesToolsKind
)

// scanAdded is what checking an array (or its first n elements) added to the scanner: the key
// bound of the field, the counts the bound of the whole key is made of, and the elements' count.
type scanAdded struct {
	hist               keyBound
	grow, floats, keys int
	n                  int
}

// toolsEntry is one remembered array. It is never changed once in the memo.
type toolsEntry struct {
	kind  byte
	raw   []byte // the array as sent
	key   []byte // the part of the history key written for it
	text  bool   // that part is text (a key without text is empty)
	added scanAdded
	used  atomic.Bool // matched since the clock last passed it
}

// toolsRead is what the scanner learned of one tools array: the entry that held it, or else
// where it is and what checking it added, for the history key's writer to offer the memo.
type toolsRead struct {
	kind       byte // 0: not to be remembered
	start, end int
	added      scanAdded
	entry      *toolsEntry
}

// toolsMemo is the memo, shared by all requests. Lookups take no lock: they read the current
// slice of entries, which is replaced whole when an entry is added.
type toolsMemo struct {
	entries atomic.Pointer[[]*toolsEntry]
	seed    maphash.Seed

	mu       sync.Mutex
	hand     int                   // the clock's hand: the slot looked at next for replacement
	seen     [toolsMemoSeen]uint64 // hashes of arrays met once (0: none)
	seenNext int
}

var rememberedTools = &toolsMemo{seed: maphash.MakeSeed()}

// find returns the entry whose array of kind rest begins with, or nil. An array is whole: one
// that rest begins with is the value at the start of rest.
func (m *toolsMemo) find(kind byte, rest []byte) *toolsEntry {
	p := m.entries.Load()
	if p == nil {
		return nil
	}
	for _, e := range *p {
		if e.kind == kind && len(e.raw) <= len(rest) && bytes.Equal(e.raw, rest[:len(e.raw)]) {
			if !e.used.Load() {
				e.used.Store(true)
			}
			return e
		}
	}
	return nil
}

// offer is told of an array of kind read in full: raw, the part key of the history key written
// for it, and what checking it added. It is remembered when it was offered before, and fits.
// raw and key are copied.
func (m *toolsMemo) offer(kind byte, raw, key []byte, text bool, added scanAdded) {
	if len(raw) < toolsMemoMinBytes || len(raw)+len(key) > toolsMemoMaxBytes {
		return
	}
	h := maphash.Bytes(m.seed, raw) ^ uint64(kind) | 1
	m.mu.Lock()
	defer m.mu.Unlock()
	i := slices.Index(m.seen[:], h)
	if i < 0 {
		m.seen[m.seenNext] = h
		m.seenNext = (m.seenNext + 1) % len(m.seen)
		return
	}
	m.seen[i] = 0
	if e := m.find(kind, raw); e != nil && len(e.raw) == len(raw) {
		return // another request remembered it meanwhile
	}
	e := &toolsEntry{kind: kind, raw: bytes.Clone(raw), key: bytes.Clone(key), text: text, added: added}
	var entries []*toolsEntry
	if p := m.entries.Load(); p != nil {
		entries = slices.Clone(*p)
	}
	if len(entries) < toolsMemoSlots {
		entries = append(entries, e)
	} else {
		for entries[m.hand].used.Load() {
			entries[m.hand].used.Store(false)
			m.hand = (m.hand + 1) % len(entries)
		}
		entries[m.hand] = e
		m.hand = (m.hand + 1) % len(entries)
	}
	m.entries.Store(&entries)
}

// toolsArray reads the tools array of kind at s.pos with read, which returns its length, or
// passes over it when the memo holds it. Either way the scanner is left as reading it leaves it:
// s.hist is the field's bound, and the counts are added to. kind 0 reads without the memo.
func (s *scanner) toolsArray(kind byte, read func(*scanner) int) (int, toolsRead) {
	if kind == 0 {
		return read(s), toolsRead{}
	}
	if e := rememberedTools.find(kind, s.data[s.pos:]); e != nil {
		s.pos += len(e.raw)
		s.hist = e.added.hist
		s.grow += e.added.grow
		s.floats += e.added.floats
		s.keys += e.added.keys
		return e.added.n, toolsRead{entry: e}
	}
	at := s.counts()
	n := read(s)
	return n, toolsRead{kind: kind, start: at.pos, end: s.pos, added: scanAdded{hist: s.hist,
		grow: s.grow - at.grow, floats: s.floats - at.floats, keys: s.keys - at.keys, n: n}}
}

// toolsPart writes the part of the history key for the tools array r: copied from the memo when
// it held the array, else written by write and offered to the memo.
func (h *historyWriter) toolsPart(r toolsRead, write func()) {
	if r.entry != nil {
		h.w.write(r.entry.key)
		h.w.text = h.w.text || r.entry.text
		return
	}
	text, start := h.w.text, len(h.w.buf)
	h.w.text = false
	write()
	if r.kind != 0 && !h.w.counting() {
		rememberedTools.offer(r.kind, h.v[r.start:r.end], h.w.buf[start:], h.w.text, r.added)
	}
	h.w.text = h.w.text || text
}
