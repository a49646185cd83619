package protocol

import (
	"unsafe"

	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// writer.go is where keys are written, into a buffer allocated once, however many parts a key is
// made of: at the size of a bound on the key found while the body was checked (the history key,
// see keyBound), or at the key's exact size, counted by a first pass that only counts its bytes.

// onePassLimit is the largest bound on a key of the body raw under which the key is written in
// one pass, into a buffer of the bound's size: twice the body. A buffer that size leaves parse
// memory within three times the body, however small the key turns out (see
// TestParseMemoryIsBoundedByBodySizeForTinyParts). Only bodies whose key outgrows them, or whose
// free-form values are full of numbers, have a larger bound; their key is counted first.
func onePassLimit(raw []byte) int { return 2 * len(raw) }

// keyWriter writes a key into buf, or only counts its bytes in n when buf is nil.
type keyWriter struct {
	buf  []byte
	n    int
	text bool // some text was written: a key without is empty
}

// mark is where a writer is, to go back to with reset.
type mark struct {
	len, n int
	text   bool
}

func (w *keyWriter) mark() mark { return mark{len: len(w.buf), n: w.n, text: w.text} }

// reset forgets what was written since m.
func (w *keyWriter) reset(m mark) {
	w.buf, w.n, w.text = w.buf[:m.len], m.n, m.text
}

// KeyMemory is a Header that also gives the memory a request's keys are written into: memory that
// lives as long as the request's body, so that a large request's history key is not a new heap
// allocation (the proxy's, from package bodies). KeyMemory(n) returns an empty slice with room for
// n bytes. A request's keys, read from such a Header, must not be used after its body is released.
type KeyMemory interface {
	reqkey.Header
	KeyMemory(n int) []byte
}

// keyRoom is where the keys of one body are written: in one pass when a key's bound is at most
// limit (see onePassLimit), into mem's memory when there is one, else into heap memory.
type keyRoom struct {
	limit int
	mem   KeyMemory
}

// roomFor is the room for the keys of the body raw, whose headers are h.
func roomFor(h reqkey.Header, raw []byte) keyRoom {
	mem, _ := h.(KeyMemory)
	return keyRoom{limit: onePassLimit(raw), mem: mem}
}

// writer returns a writer into a buffer of size bytes, which the key must not outgrow.
func (r keyRoom) writer(size int) keyWriter {
	if r.mem != nil {
		return keyWriter{buf: r.mem.KeyMemory(size)[:0:size]}
	}
	return writerOf(size)
}

// writerOf returns a writer into a new buffer of size bytes, which the key must not outgrow.
func writerOf(size int) keyWriter { return keyWriter{buf: make([]byte, 0, size)} }

func (w *keyWriter) counting() bool { return w.buf == nil }

// string returns what w wrote, without a copy: w must not be written to after.
func (w *keyWriter) string() string {
	return unsafe.String(unsafe.SliceData(w.buf), len(w.buf))
}

func (w *keyWriter) byte(c byte) {
	w.n++
	if w.buf != nil {
		w.buf = append(w.buf, c)
	}
}

func (w *keyWriter) write(p []byte) {
	w.n += len(p)
	if w.buf != nil {
		w.buf = append(w.buf, p...)
	}
}

func (w *keyWriter) writeString(s string) {
	w.n += len(s)
	if w.buf != nil {
		w.buf = append(w.buf, s...)
	}
}

// value writes the value of the string j.
func (w *keyWriter) value(j jstr) {
	switch {
	case j.plain:
		w.write(j.raw)
		return
	case w.buf == nil:
		w.n += j.len()
		return
	}
	start := len(w.buf)
	w.buf = j.appendTo(w.buf)
	w.n += len(w.buf) - start
}

// fieldEnd is the byte that ends every field of a key (see historyKey): 0xFF, which no UTF-8
// text holds. Every value a key writes is valid UTF-8 (a string's value, with each byte of
// invalid UTF-8 and each lone surrogate escape replaced by U+FFFD, or canonical JSON), so the end
// of a field never needs escaping inside one: a field is its content followed by fieldEnd, and
// its content is a byte prefix of what follows its tag, however it ends.
const fieldEnd = 0xFF

// emptyField is a field without content, for the bounds the schema readers sum (see keyBound).
const emptyField = "\xff"

// fieldSize is the size of a field whose content takes n bytes: the content and its end.
func fieldSize(n int) int { return n + len(emptyField) }

// field writes the value of the string j as a field: the value, then fieldEnd.
func (w *keyWriter) field(j jstr) {
	w.value(j)
	w.byte(fieldEnd)
}
