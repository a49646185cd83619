package protocol

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"unicode/utf8"
)

// validated.go reads again a document the lexer has accepted. Trusting the grammar, it only finds
// where values begin and end (for a string, a search for its closing quote), so that the history
// key can be written from positions in the body rather than from copies of its parts.

// valid is a JSON document the lexer has accepted. Positions in it are byte offsets.
type valid []byte

// ws returns the first position from i on that is not whitespace.
func (v valid) ws(i int) int {
	if i < len(v) && v[i] > ' ' {
		return i // no whitespace: the common case of compact JSON
	}
	for i < len(v) {
		switch v[i] {
		case ' ', '\t', '\n', '\r':
			i++
		default:
			return i
		}
	}
	return i
}

// str returns the string at i and the position after it. It reads the string a word at a time,
// looking for its closing quote and for what makes it other than its value: an escape or a byte
// outside ASCII (then valid UTF-8 or not). Past the first words of plain ASCII, a long string is
// read at memchr speed instead (see longStr).
func (v valid) str(i int) (jstr, int) {
	start := i + 1
	j := start
	for words := 0; j+8 <= len(v); words++ {
		if words == 4 {
			return v.longStr(start, j)
		}
		w := binary.LittleEndian.Uint64(v[j:])
		if m := quoteOrBackslash8(w) | w&highs; m != 0 {
			j += bits.TrailingZeros64(m) / 8
			if v[j] == '"' {
				return jstr{raw: v[start:j], plain: true}, j + 1
			}
			break
		}
		j += 8
	}
	return v.strFrom(start, j)
}

// longStr returns the string whose contents start at start and are plain ASCII up to j, and the
// position after it. The first quote from j closes it unless a backslash comes before: then it
// has an escape, and its end is found by closingQuote. Otherwise it is the string's value when it
// is valid UTF-8, which utf8.Valid checks at the speed of ASCII until it finds a byte outside.
func (v valid) longStr(start, j int) (jstr, int) {
	q := j + bytes.IndexByte(v[j:], '"')
	if bytes.IndexByte(v[j:q], '\\') >= 0 {
		q = v.closingQuote(j)
		return jstr{raw: v[start:q]}, q + 1
	}
	return jstr{raw: v[start:q], plain: utf8.Valid(v[j:q])}, q + 1
}

// strFrom returns the string whose contents start at start and are plain ASCII up to j, and the
// position after it.
func (v valid) strFrom(start, j int) (jstr, int) {
	high := false
	highMask := uint64(highs) // bytes outside ASCII are looked at until one is found
	for {
		for ; j+8 <= len(v); j += 8 {
			w := binary.LittleEndian.Uint64(v[j:])
			if m := quoteOrBackslash8(w) | w&highMask; m != 0 {
				j += bits.TrailingZeros64(m) / 8 // the first such byte: later bits may be wrong
				break
			}
		}
		switch c := v[j]; {
		case c == '"':
			raw := v[start:j]
			return jstr{raw: raw, plain: !high || utf8.Valid(raw)}, j + 1
		case c == '\\': // not the value: only its end is left to find
			q := v.closingQuote(j)
			return jstr{raw: v[start:q]}, q + 1
		case c >= utf8.RuneSelf:
			high, highMask = true, 0
			j++
		default: // the last bytes of the document, fewer than a word
			j++
		}
	}
}

// strEnd returns the position after the string at i. It reads a few words for the closing quote
// before handing the rest to closingQuote, whose IndexByte is fast once started but slow to start.
func (v valid) strEnd(i int) int {
	j := i + 1
	for words := 0; words < 4 && j+8 <= len(v); words++ {
		if m := quoteOrBackslash8(binary.LittleEndian.Uint64(v[j:])); m != 0 {
			j += bits.TrailingZeros64(m) / 8 // the first such byte: later bits may be wrong
			if v[j] == '"' {
				return j + 1
			}
			break
		}
		j += 8
	}
	return v.closingQuote(j) + 1
}

// closingQuote returns the position of the quote that closes the string in which j is, outside
// an escape. Only an escape can hold a quote, and an escaped quote is one after an odd run of
// backslashes: a run of them starts an escape (none ends with a backslash but \\), so it is
// escapes of a backslash, and a last one that escapes the quote when it is odd. Escapes of other
// bytes, a newline every few bytes in code, are passed over at memchr speed.
func (v valid) closingQuote(j int) int {
	for {
		q := j + bytes.IndexByte(v[j:], '"')
		b := q
		for v[b-1] == '\\' {
			b--
		}
		if (q-b)%2 == 0 {
			return q
		}
		j = q + 1
	}
}

// quoteOrBackslash8 sets the high bit of the first byte of w that is a quote or a backslash (and
// perhaps of later bytes), and of none when there is none.
func quoteOrBackslash8(w uint64) uint64 {
	return (zeroByte(w^'"'*ones) | zeroByte(w^'\\'*ones)) & highs
}

// skip returns the position after the value at i.
func (v valid) skip(i int) int {
	depth := 0
	for {
		switch v[i] {
		case '"':
			i = v.strEnd(i)
		case '{', '[':
			depth++
			i++
		case '}', ']':
			depth--
			i++
		case ',', ':', ' ', '\t', '\n', '\r':
			i++
		default: // a number or a literal
			for i < len(v) && !delimiter[v[i]] {
				i++
			}
		}
		if depth == 0 {
			return i
		}
	}
}

// delimiter marks the bytes that can follow a number or a literal.
var delimiter = [256]bool{',': true, ']': true, '}': true, ' ': true, '\t': true, '\n': true, '\r': true}

// first returns the position of the first element of the array or object at i (for an object,
// of its first key) and true, or the position after the container and false when it is empty.
func (v valid) first(i int) (int, bool) {
	return v.more(v.ws(i + 1))
}

// next returns the position of the element after the one that ends at i and true, or the
// position after the container and false when that element was the last.
func (v valid) next(i int) (int, bool) {
	return v.more(v.ws(i))
}

func (v valid) more(i int) (int, bool) {
	switch v[i] {
	case ',':
		return v.ws(i + 1), true
	case ']', '}':
		return i + 1, false
	}
	return i, true
}

// member returns the key of the object member at i and the position of its value.
func (v valid) member(i int) (jstr, int) {
	key, j := v.str(i)
	j = v.ws(j) + 1 // the colon
	return key, v.ws(j)
}

// fold reads an array field given more than once the way encoding/json decodes each array into
// the same Go slice (see arrays): element i of the field is element i of each array that has one,
// each decoded over what the earlier ones left, and the field has as many elements as the last
// array. cursors holds the position of each array, in order, and is used up as scratch space:
// read is called with the position of each array's element i in turn and returns the position
// after it, then emit is called once element i is complete.
func (v valid) fold(cursors []int, read func(pos int) int, emit func()) {
	n := 0
	for i, a := range cursors {
		if pos, ok := v.first(a); ok {
			cursors[n] = pos
			n++
		} else if i == len(cursors)-1 {
			return // the last array is empty: so is the field
		}
	}
	cursors = cursors[:n]
	for len(cursors) > 0 {
		// Cursors of arrays that have ended are dropped as they end, so every element is
		// read once however many arrays there are and however long each is.
		kept, lastEnded := 0, false
		for j, pos := range cursors {
			if next, ok := v.next(read(pos)); ok {
				cursors[kept] = next
				kept++
			} else if j == len(cursors)-1 {
				lastEnded = true
			}
		}
		cursors = cursors[:kept]
		emit()
		if lastEnded {
			return
		}
	}
}
