package protocol

import (
	"bytes"
	"hash/maphash"
	"slices"
	"sync"
)

// convmemo.go remembers the conversations of recent requests, so that a turn pays for what it
// appends rather than for the whole conversation again. Every turn of an agent resends the
// conversation: a messages array whose elements are the earlier turn's, byte for byte, but for
// the last (Claude Code moves its cache marker from it to the newest message), and a few new
// ones. The memo keeps, of a request's conversation array, its bytes from the opening bracket
// through the last element but one, with what checking them added to the scanner and the part of
// the history key written for them. A body whose array begins with remembered bytes is checked
// and written from the first element after them: the lexer adds the remembered counts, the key
// copies the remembered part (each element's part of the key depends on that element alone).
//
// A conversation is remembered from its second turn: the first offers only the hash of its
// beginning, so that requests that begin no conversation copy nothing. A turn that extends an
// entry replaces it, appending to its bytes rather than copying them again. A turn then costs a
// comparison of the remembered bytes and a copy of their key part, at memory speed, and the
// reading of what it appends. Entries are found by the hash of their first
// convHeadBytes bytes and compared in full. The memo holds at most convMemoBytes of arrays and
// key parts together, giving up the oldest entries past that, and at most convBucket entries that
// begin alike (conversations that share their first message).

const (
	convHeadBytes  = 1 << 10  // an array shorter than this is read faster than remembered
	convTailBytes  = 64       // compared first (at most convHeadBytes)
	convMemoBytes  = 64 << 20 // arrays and key parts, all entries together
	convEntryBytes = 16 << 20 // one entry's array and key part, at most
	convBucket     = 8        // entries whose first convHeadBytes bytes are alike
	convSeen       = 256      // beginnings of arrays offered once, remembered by hash
)

// The conversation arrays the memo holds, by API: the same bytes are read differently by each.
const (
	chatMessagesKind byte = 'C' + iota
	messagesMessagesKind
)

// convEntry is the beginning of one remembered conversation array. Its bytes are never changed
// once in the memo: an entry that extends it appends past their length.
type convEntry struct {
	kind  byte
	raw   []byte // the array from its bracket through its last element remembered
	key   []byte // the part of the history key written for those elements
	text  bool   // that part is text
	added scanAdded
	head  uint64
	// Under the memo's lock: gone is replaced or given up (no longer in its bucket); extended is
	// that an entry replacing it appends to its raw and key, past their length, so no other may.
	gone, extended bool
}

// size is the memory e holds.
func (e *convEntry) size() int { return cap(e.raw) + cap(e.key) }

// convMark is where the scanner is after an element of a conversation array, and what checking
// the array up to there added.
type convMark struct {
	end   int
	added scanAdded
}

// convRead is what the scanner learned of a conversation array: where it starts, the entry it
// began with (if any), and the mark after its last element but one, for the writer to offer.
type convRead struct {
	kind     byte // 0: not read through the memo
	start    int
	entry    *convEntry
	boundary convMark // n 0: fewer than two elements past the entry
}

type convMemo struct {
	seed  maphash.Seed
	limit int // bytes of arrays and key parts, all entries together

	mu       sync.RWMutex
	buckets  map[uint64][]*convEntry
	queue    []*convEntry // oldest first; gone entries are dropped as they reach the front
	bytes    int
	seen     [convSeen]uint64 // heads offered once (0: none)
	seenNext int
}

var rememberedConversations = newConvMemo(convMemoBytes)

func newConvMemo(limit int) *convMemo {
	return &convMemo{seed: maphash.MakeSeed(), limit: limit, buckets: map[uint64][]*convEntry{}}
}

// headOf is the hash entries of kind beginning with raw are found by.
func (m *convMemo) headOf(kind byte, raw []byte) uint64 {
	return maphash.Bytes(m.seed, raw[:convHeadBytes]) ^ uint64(kind) | 1
}

// find returns the longest entry of kind whose array rest begins with, or nil. Conversations that
// begin alike often share much more (a long first message), so an entry's last convTailBytes are
// compared first: another conversation's differ there.
func (m *convMemo) find(kind byte, rest []byte) *convEntry {
	if len(rest) < convHeadBytes {
		return nil
	}
	head := m.headOf(kind, rest)
	m.mu.RLock()
	defer m.mu.RUnlock()
	var best *convEntry
	for _, e := range m.buckets[head] {
		n := len(e.raw)
		if e.kind == kind && n <= len(rest) && (best == nil || n > len(best.raw)) &&
			bytes.Equal(e.raw[n-convTailBytes:], rest[n-convTailBytes:n]) && bytes.Equal(e.raw, rest[:n]) {
			best = e
		}
	}
	return best
}

// offer is told of the beginning raw of a conversation array of kind, the part key of the
// history key written for it, and what checking it added; old is the entry the array began with,
// if any. It remembers them, replacing old, when old is given or the beginning was offered
// before. raw and key are copied, or appended to old's.
func (m *convMemo) offer(kind byte, raw, key []byte, text bool, added scanAdded, old *convEntry) {
	if len(raw) < convHeadBytes || len(raw)+len(key) > convEntryBytes {
		return
	}
	head := m.headOf(kind, raw)
	m.mu.Lock()
	defer m.mu.Unlock()
	if old == nil {
		i := slices.Index(m.seen[:], head)
		if i < 0 {
			m.seen[m.seenNext] = head
			m.seenNext = (m.seenNext + 1) % len(m.seen)
			return
		}
		m.seen[i] = 0
	}
	for _, b := range m.buckets[head] {
		if b.kind == kind && len(b.raw) == len(raw) && bytes.Equal(b.raw, raw) {
			return // remembered by another request meanwhile
		}
	}
	e := &convEntry{kind: kind, text: text, added: added, head: head}
	if old != nil && !old.gone && !old.extended {
		// raw and key begin with old's: append what follows, in place when there is room.
		old.extended = true
		e.raw = append(old.raw, raw[len(old.raw):]...)
		e.key = append(old.key, key[len(old.key):]...)
	} else {
		e.raw = append(make([]byte, 0, len(raw)+len(raw)/4), raw...)
		e.key = append(make([]byte, 0, len(key)+len(key)/4), key...)
	}
	if old != nil {
		m.remove(old)
	}
	bucket := m.buckets[head]
	if len(bucket) == convBucket {
		m.remove(bucket[0])
		bucket = m.buckets[head]
	}
	m.buckets[head] = append(bucket, e)
	m.queue = append(m.queue, e)
	m.bytes += e.size()
	for len(m.queue) > 0 && (m.bytes > m.limit || m.queue[0].gone) {
		m.remove(m.queue[0])
		m.queue = m.queue[1:]
	}
	if cap(m.queue) > 2*len(m.queue)+64 {
		m.queue = append([]*convEntry(nil), m.queue...) // let the dropped front go
	}
}

// remove takes e out of its bucket; mu is held.
func (m *convMemo) remove(e *convEntry) {
	if e.gone {
		return
	}
	e.gone = true
	m.bytes -= e.size()
	bucket := m.buckets[e.head]
	for i, b := range bucket {
		if b == e {
			bucket = append(bucket[:i:i], bucket[i+1:]...)
			break
		}
	}
	if len(bucket) == 0 {
		delete(m.buckets, e.head)
	} else {
		m.buckets[e.head] = bucket
	}
}

// conversation reads the conversation array of kind at s.pos, whose elements elem checks, and
// returns its length. When the memo holds the array's beginning, checking starts after it, with
// the counts checking it added. s.hist must be as the field's reader sets it before its array.
func (s *scanner) conversation(kind byte, elem func(*scanner)) (int, convRead) {
	r := convRead{kind: kind, start: s.pos}
	at := s.counts()
	if !s.open() {
		return 0, r
	}
	n, first := 0, true
	if e := rememberedConversations.find(kind, s.data[r.start:]); e != nil {
		r.entry, n, first = e, e.added.n, false
		s.pos = r.start + len(e.raw)
		s.hist = e.added.hist
		s.grow += e.added.grow
		s.floats += e.added.floats
		s.keys += e.added.keys
	}
	var last convMark
	for ; s.next(']', first); first = false {
		r.boundary = last
		elem(s)
		n++
		if s.err != nil {
			break
		}
		last = convMark{end: s.pos, added: scanAdded{hist: s.hist, grow: s.grow - at.grow,
			floats: s.floats - at.floats, keys: s.keys - at.keys, n: n}}
	}
	return n, r
}

// conversationPart writes the part of the history key for the conversation array r, one element
// at a time with each, which returns the position after the element: from the first element
// after the entry r began with, whose part is copied. The array up to r's boundary is offered to
// the memo.
func (h *historyWriter) conversationPart(r convRead, each func(pos int) int) {
	text, start := h.w.text, len(h.w.buf)
	h.w.text = false
	e, more, n := 0, false, 0
	if r.entry != nil {
		h.w.write(r.entry.key)
		h.w.text = r.entry.text
		e, more = h.v.next(r.start + len(r.entry.raw))
		n = r.entry.added.n
	} else {
		e, more = h.v.first(r.start)
	}
	boundary, boundaryText := -1, false
	for more {
		end := each(e)
		if n++; n == r.boundary.added.n {
			boundary, boundaryText = len(h.w.buf), h.w.text
		}
		e, more = h.v.next(end)
	}
	if r.kind != 0 && boundary >= 0 && !h.w.counting() {
		rememberedConversations.offer(r.kind, h.v[r.start:r.boundary.end], h.w.buf[start:boundary],
			boundaryText, r.boundary.added, r.entry)
	}
	h.w.text = h.w.text || text
}
