package reqkey

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// writer.go is where keys are written, into a builder allocated once, however many parts a key is
// made of: at the size of a bound on the key found while the body was checked (the history key,
// see keyBound), or at the key's exact size, counted by a first pass that only counts its bytes.

// keyWriter writes a key into sb, or only counts its bytes in n when sb is nil.
type keyWriter struct {
	sb   *strings.Builder
	n    int
	text bool // some text was written: a key without is empty
}

func (w *keyWriter) counting() bool { return w.sb == nil }

func (w *keyWriter) byte(c byte) {
	w.n++
	if w.sb != nil {
		w.sb.WriteByte(c)
	}
}

func (w *keyWriter) write(p []byte) {
	w.n += len(p)
	if w.sb != nil {
		w.sb.Write(p)
	}
}

func (w *keyWriter) writeString(s string) {
	w.n += len(s)
	if w.sb != nil {
		w.sb.WriteString(s)
	}
}

// int writes n, at least 0, in decimal.
func (w *keyWriter) int(n int) {
	switch {
	case n < 10:
		w.byte('0' + byte(n))
	case w.sb == nil:
		for ; n > 0; n /= 10 {
			w.n++
		}
	default:
		var buf [20]byte
		w.write(strconv.AppendInt(buf[:0], int64(n), 10))
	}
}

// value writes the value of the string j.
func (w *keyWriter) value(j jstr) {
	switch {
	case j.plain:
		w.write(j.raw)
		return
	case w.sb == nil:
		w.n += j.len()
		return
	}
	raw := j.raw
	for i := 0; i < len(raw); {
		// Copy the longest run of bytes that are their own value, then decode one character.
		start := i
		for i < len(raw) && raw[i] != '\\' {
			if raw[i] < utf8.RuneSelf {
				i++
			} else if r, size := utf8.DecodeRune(raw[i:]); r != utf8.RuneError || size > 1 {
				i += size
			} else {
				break // a byte of invalid UTF-8
			}
		}
		w.write(raw[start:i])
		if i < len(raw) {
			var buf [utf8.UTFMax]byte
			var r rune
			r, i = decodeRune(raw, i)
			w.write(utf8.AppendRune(buf[:0], r))
		}
	}
}

// lp writes the value of the string j behind its length prefix: "<len>:<value>".
func (w *keyWriter) lp(j jstr) {
	w.int(j.len())
	w.byte(':')
	w.value(j)
}
