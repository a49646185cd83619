package protocol

import (
	"bytes"
	"encoding/binary"
	"math/bits"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// jsonstr.go works with the value of a JSON string in place: its length, its comparison with
// another and its bytes are read from the string as written in the body, so no decoded copy is
// made. The value is the one encoding/json decodes: a lone or mismatched UTF-16 surrogate escape
// and every byte of invalid UTF-8 stand for U+FFFD.

// jstr is a JSON string the lexer has validated: the bytes between its quotes.
type jstr struct {
	raw   []byte
	plain bool // raw is the value itself: it has no escape and is valid UTF-8
}

// decodeRune returns the character of the value that s[i:] starts with, and where the next one
// starts. s holds the validated contents of a JSON string.
func decodeRune(s []byte, i int) (rune, int) {
	c := s[i]
	switch {
	case c == '\\':
		if s[i+1] != 'u' {
			return rune(unescape(s[i+1])), i + 2
		}
		r := hex4(s[i+2:])
		i += 6
		if !utf16.IsSurrogate(r) {
			return r, i
		}
		r1 := rune(-1)
		if i+6 <= len(s) && s[i] == '\\' && s[i+1] == 'u' {
			r1 = hex4(s[i+2:])
		}
		if dec := utf16.DecodeRune(r, r1); dec != unicode.ReplacementChar {
			return dec, i + 6
		}
		return unicode.ReplacementChar, i
	case c < utf8.RuneSelf:
		return rune(c), i + 1
	}
	r, size := utf8.DecodeRune(s[i:])
	return r, i + size
}

// ownValue returns the first position from i on in s, the validated contents of a JSON string,
// of a byte that is not its own value: a backslash, or a byte of invalid UTF-8; len(s) when there
// is none. ASCII is skipped a word at a time, valid UTF-8 a character at a time.
func ownValue(s []byte, i int) int {
	for i < len(s) {
		for i+8 <= len(s) {
			w := binary.LittleEndian.Uint64(s[i:])
			if m := (zeroByte(w^'\\'*ones) | w) & highs; m != 0 {
				i += bits.TrailingZeros64(m) / 8 // the first backslash or byte outside ASCII
				break
			}
			i += 8
		}
		for i < len(s) && s[i] < utf8.RuneSelf && s[i] != '\\' {
			i++
		}
		if i == len(s) || s[i] == '\\' {
			return i
		}
		r, size := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && size == 1 {
			return i
		}
		i += size
	}
	return i
}

// len is the length of the value in bytes.
func (j jstr) len() int {
	if j.plain {
		return len(j.raw)
	}
	s, n := j.raw, 0
	for i := 0; i < len(s); {
		k := ownValue(s, i)
		n += k - i
		switch {
		case k == len(s):
			return n
		case s[k] == '\\' && s[k+1] != 'u':
			n++
			i = k + 2
		default:
			var r rune
			r, i = decodeRune(s, k)
			n += utf8.RuneLen(r)
		}
	}
	return n
}

// empty reports whether the value is the empty string. Every escape and every byte between the
// quotes stands for at least one character, so only a string with nothing written between them
// is empty: no decoding needed, unlike len.
func (j jstr) empty() bool { return len(j.raw) == 0 }

// appendTo appends the value to b: runs of bytes that are their own value copied whole, and a
// one-letter escape, the commonest other thing in code and tool output, written without decoding
// it as a character.
func (j jstr) appendTo(b []byte) []byte {
	if j.plain {
		return append(b, j.raw...)
	}
	s := j.raw
	for i := 0; i < len(s); {
		k := ownValue(s, i)
		b = append(b, s[i:k]...)
		switch {
		case k == len(s):
			return b
		case s[k] == '\\' && s[k+1] != 'u':
			b = append(b, unescape(s[k+1]))
			i = k + 2
		default:
			var r rune
			r, i = decodeRune(s, k)
			b = utf8.AppendRune(b, r)
		}
	}
	return b
}

// name returns the value when it fits buf, which is all an object key needs to be matched
// against field names. A longer value is returned as it was written: with an escape or invalid
// UTF-8 in it, it matches no field name.
func (j jstr) name(buf []byte) []byte {
	if j.plain || j.len() > len(buf) {
		return j.raw
	}
	return j.appendTo(buf[:0])
}

// is reports whether the value is s.
func (j jstr) is(s string) bool {
	if j.plain {
		return string(j.raw) == s
	}
	return compareJstr(j, jstr{raw: []byte(s), plain: true}) == 0
}

// special marks the bytes of a string's contents that decodeRune has to look at: the backslash
// and every byte outside ASCII.
var special = func() (t [256]bool) {
	for c := range 256 {
		t[c] = c == '\\' || c >= utf8.RuneSelf
	}
	return t
}()

// compareJstr compares the values of a and b byte-wise, as strings.Compare compares the decoded
// strings: the values are valid UTF-8, whose byte order is the order of their characters.
func compareJstr(a, b jstr) int {
	if a.plain && b.plain {
		return bytes.Compare(a.raw, b.raw)
	}
	i, k := 0, 0
	for i < len(a.raw) && k < len(b.raw) {
		ca, cb := a.raw[i], b.raw[k]
		if ca == cb && !special[ca] {
			i++
			k++
			continue
		}
		var ra, rb rune
		ra, i = decodeRune(a.raw, i)
		rb, k = decodeRune(b.raw, k)
		if ra != rb {
			if ra < rb {
				return -1
			}
			return 1
		}
	}
	switch {
	case i < len(a.raw):
		return 1
	case k < len(b.raw):
		return -1
	}
	return 0
}
