package protocol

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/bits"
	"strconv"
	"unicode/utf8"
)

// lexer.go is the JSON lexer: a single-pass scanner that checks a document against the JSON
// grammar exactly as strictly as encoding/json does, and hands the body readers (schema.go) the
// tokens it asks for: object keys, strings, numbers and literals. Whatever the schema reader does
// not ask for it validates and skips without building anything. Strings without escapes or invalid
// UTF-8 are returned as sub-slices of the document; the others are decoded as encoding/json
// decodes them.

// maxDepth is the deepest nesting of arrays and objects accepted, encoding/json's limit.
const maxDepth = 10000

// nameLen is the size of the buffers an escaped key or type name is decoded into to be matched:
// the longest name any reader matches ("previous_response_id", "function_call_output") fits.
const nameLen = 24

// scanner is the reading position in one JSON document and what went wrong so far.
type scanner struct {
	data    []byte
	pos     int
	depth   int
	err     *Error        // the document is malformed: scanning stops
	typeErr *Error        // the first field of the wrong type: scanning goes on
	path    []string      // the names of the typed fields being read, for type errors
	stack   []byte        // closing bytes of the containers skip is inside
	keyBuf  [nameLen]byte // the value of the last key read, when it has an escape

	// For the schema reader to bound the size of the history key (see keyBound): grow is the
	// bytes the strings read so far may add to their length when decoded or written in canonical
	// form, floats counts the numbers of free-form values read so far that canonical form may
	// write otherwise than as they are, and keys counts the object keys read so far.
	grow, floats, keys int
	hist               keyBound // of the elements of the messages or tools array being read
}

// object reads the object at s.pos, calling member with each decoded key and s.pos at its value.
func (s *scanner) object(member func(*scanner, []byte)) {
	if !s.open() {
		return
	}
	for first := true; s.next('}', first); first = false {
		key := s.key()
		if s.err != nil {
			return
		}
		member(s, key)
		if s.err != nil {
			return
		}
	}
}

// array reads the array at s.pos, calling elem with s.pos at each element, and returns its length.
func (s *scanner) array(elem func(*scanner)) int {
	if !s.open() {
		return 0
	}
	n := 0
	for first := true; s.next(']', first); first = false {
		elem(s)
		n++
		if s.err != nil {
			break
		}
	}
	return n
}

// syntax records that the document is malformed at s.pos.
func (s *scanner) syntax() {
	if s.err != nil {
		return
	}
	if s.pos >= len(s.data) {
		s.err = &Error{"invalid JSON body: unexpected end of JSON input"}
		return
	}
	c := s.data[s.pos]
	q := "'" + string(rune(c)) + "'"
	if c < 0x20 || c >= 0x7f || c == '\'' || c == '"' {
		q = strconv.Quote(string(rune(c)))
	}
	s.err = &Error{fmt.Sprintf("invalid JSON body: invalid character %s at offset %d", q, s.pos)}
}

func (s *scanner) peek() byte {
	if s.pos < len(s.data) {
		return s.data[s.pos]
	}
	return 0
}

func (s *scanner) ws() {
	for s.pos < len(s.data) {
		switch s.data[s.pos] {
		case ' ', '\t', '\n', '\r':
			s.pos++
		default:
			return
		}
	}
}

// open enters the array or object at s.pos.
func (s *scanner) open() bool {
	s.depth++
	if s.depth > maxDepth {
		if s.err == nil {
			s.err = &Error{"invalid JSON body: exceeded max depth"}
		}
		return false
	}
	s.pos++
	return true
}

// next reports whether another element of the open container follows, consuming the comma before
// it, or else consumes the closing byte. first says no element has been read yet.
func (s *scanner) next(closing byte, first bool) bool {
	if s.err != nil {
		return false
	}
	s.ws()
	switch c := s.peek(); {
	case c == closing:
		s.pos++
		s.depth--
		return false
	case first && s.pos < len(s.data):
		return true
	case c == ',' && !first:
		s.pos++
		s.ws()
		return true
	}
	s.syntax()
	return false
}

// key reads an object key and the colon after it, leaving s.pos at the value. It returns the
// key's value when it fits keyBuf (until the next key is read), which is all matching field names
// needs; a longer key is returned as written.
func (s *scanner) key() []byte {
	if s.peek() != '"' {
		s.syntax()
		return nil
	}
	s.keys++
	raw, escaped, high := s.str()
	if s.err != nil {
		return nil
	}
	s.ws()
	if s.peek() != ':' {
		s.syntax()
		return nil
	}
	s.pos++
	s.ws()
	return jstr{raw: raw, plain: !escaped && (!high || utf8.Valid(raw))}.name(s.keyBuf[:])
}

func (s *scanner) null() { s.literal("null") }

// literal reads the literal word at s.pos and reports whether it is true.
func (s *scanner) literal(word string) bool {
	if !bytes.HasPrefix(s.data[s.pos:], []byte(word)) {
		for i := 0; s.pos < len(s.data) && i < len(word) && s.data[s.pos] == word[i]; i++ {
			s.pos++
		}
		s.syntax()
		return false
	}
	s.pos += len(word)
	return word == "true"
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

// number reads a number and returns it as written.
func (s *scanner) number() []byte {
	d, i := s.data, s.pos
	start := i
	if i < len(d) && d[i] == '-' {
		i++
	}
	switch {
	case i < len(d) && d[i] == '0':
		i++
	case i < len(d) && d[i] >= '1' && d[i] <= '9':
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	default:
		s.pos = i
		s.syntax()
		return nil
	}
	if i < len(d) && d[i] == '.' {
		if i++; i >= len(d) || !isDigit(d[i]) {
			s.pos = i
			s.syntax()
			return nil
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	if i < len(d) && (d[i] == 'e' || d[i] == 'E') {
		if i++; i < len(d) && (d[i] == '+' || d[i] == '-') {
			i++
		}
		if i >= len(d) || !isDigit(d[i]) {
			s.pos = i
			s.syntax()
			return nil
		}
		for i < len(d) && isDigit(d[i]) {
			i++
		}
	}
	s.pos = i
	return d[start:i]
}

// plain marks the bytes a string can hold that need no further look: printable ASCII but the quote
// and the backslash.
var plain = func() (t [256]bool) {
	for c := 0x20; c < 0x80; c++ {
		t[c] = c != '"' && c != '\\'
	}
	return t
}()

// str reads the string at s.pos and returns the bytes between its quotes, whether they hold an
// escape, and whether they hold a byte outside ASCII. It reads plain bytes a word at a time; past
// eight words of them, a long run is read by finding the next quote and backslash at memchr speed
// and checking only that the bytes before them are printable ASCII (see printable). Escapes and
// bytes outside ASCII closer together than that, as in code or in text other than English, are
// read a word at a time, which is faster for short runs.
func (s *scanner) str() (raw []byte, escaped, high bool) {
	d := s.data
	start := s.pos + 1
	i := start
	quote, slash := -1, -1 // where the next quote and backslash from i are, once looked for
	for {
		words := 0
		for words < 8 && i+8 <= len(d) && !special8(binary.LittleEndian.Uint64(d[i:])) {
			i += 8
			words++
		}
		if words == 8 {
			if quote < i {
				quote = indexFrom(d, i, '"')
			}
			if slash < i {
				slash = indexFrom(d[:quote], i, '\\')
			}
			i += printable(d[i:min(quote, slash)])
		}
		for i < len(d) && plain[d[i]] {
			i++
		}
		if i >= len(d) {
			s.pos = i
			s.syntax()
			return nil, false, false
		}
		switch c := d[i]; {
		case c == '"':
			s.pos = i + 1
			return d[start:i], escaped, high
		case c == '\\':
			escaped = true
			n := escapeLen(d[i:])
			if n == 0 {
				s.pos = i + 1
				if s.pos < len(d) && d[s.pos] == 'u' {
					s.pos++
					for s.pos < len(d) && isHex(d[s.pos]) {
						s.pos++
					}
				}
				s.syntax()
				return nil, false, false
			}
			i += n
		case c < 0x20:
			s.pos = i
			s.syntax()
			return nil, false, false
		default:
			high = true
			// A byte of invalid UTF-8 decodes to U+FFFD, three bytes; encoding/json writes
			// U+2028 and U+2029 as six-byte escapes.
			r, size := utf8.DecodeRune(d[i:])
			switch {
			case size == 1:
				s.grow += 2
			case r == '\u2028' || r == '\u2029':
				s.grow += 3
			}
			i += size
		}
	}
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

// indexFrom returns the position of the first c in d from i on, or len(d) when there is none.
func indexFrom(d []byte, i int, c byte) int {
	if k := bytes.IndexByte(d[i:], c); k >= 0 {
		return i + k
	}
	return len(d)
}

// printable returns how many bytes b starts with that are printable ASCII: none is a control
// byte or outside ASCII. It reads four words at a time while all are.
func printable(b []byte) int {
	const space = 0x20 * ones
	i := 0
	for ; i+32 <= len(b); i += 32 {
		w0, w1 := binary.LittleEndian.Uint64(b[i:]), binary.LittleEndian.Uint64(b[i+8:])
		w2, w3 := binary.LittleEndian.Uint64(b[i+16:]), binary.LittleEndian.Uint64(b[i+24:])
		if ((w0-space)|w0|(w1-space)|w1|(w2-space)|w2|(w3-space)|w3)&highs != 0 {
			break
		}
	}
	for ; i+8 <= len(b); i += 8 {
		// A byte below 0x20 sets its high bit in w-space (and perhaps, borrowing, those of
		// later bytes), a byte outside ASCII in w: the first high bit set is the first such byte.
		w := binary.LittleEndian.Uint64(b[i:])
		if m := ((w - space) | w) & highs; m != 0 {
			return i + bits.TrailingZeros64(m)/8
		}
	}
	for i < len(b) && b[i] >= 0x20 && b[i] < utf8.RuneSelf {
		i++
	}
	return i
}

// special8 reports whether any of the eight bytes in w needs a look inside a string: a control
// byte, a quote, a backslash or a byte outside ASCII. It may not say which, only whether.
func special8(w uint64) bool {
	return (below(w, 0x20)|zeroByte(w^'"'*ones)|zeroByte(w^'\\'*ones)|w)&highs != 0
}

// zeroByte sets the high bit of some byte when w has a zero byte, and of none otherwise.
func zeroByte(w uint64) uint64 { return (w - ones) &^ w }

// below sets the high bit of some byte when w has a byte below n (at most 0x80), and of none
// otherwise.
func below(w uint64, n uint64) uint64 { return (w - n*ones) &^ w }

// escapeLen is the length of the valid escape sequence e starts with, or 0.
func escapeLen(e []byte) int {
	if len(e) < 2 {
		return 0
	}
	switch e[1] {
	case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
		return 2
	case 'u':
		if len(e) >= 6 && isHex(e[2]) && isHex(e[3]) && isHex(e[4]) && isHex(e[5]) {
			return 6
		}
	}
	return 0
}

func isHex(c byte) bool { return isDigit(c) || (c|0x20 >= 'a' && c|0x20 <= 'f') }

// stringValue reads a string and returns its decoded value: a sub-slice of the document when it
// has no escape and is valid UTF-8, else a new unquoted copy.
func (s *scanner) stringValue() []byte {
	raw, escaped, high := s.str()
	if !escaped && (!high || utf8.Valid(raw)) {
		return raw
	}
	return unquote(raw)
}

// unquote decodes the validated contents of a JSON string as encoding/json does: a lone or
// mismatched UTF-16 surrogate escape and every byte of invalid UTF-8 become U+FFFD.
func unquote(s []byte) []byte {
	return jstr{raw: s}.appendTo(make([]byte, 0, len(s)+utf8.UTFMax))
}

// unescape is the byte a one-letter escape stands for.
func unescape(c byte) byte {
	switch c {
	case 'b':
		return '\b'
	case 'f':
		return '\f'
	case 'n':
		return '\n'
	case 'r':
		return '\r'
	case 't':
		return '\t'
	}
	return c
}

// hex4 is the value of four validated hex digits.
func hex4(h []byte) rune {
	var r rune
	for _, c := range h[:4] {
		switch {
		case c <= '9':
			c -= '0'
		case c >= 'a':
			c -= 'a' - 10
		default:
			c -= 'A' - 10
		}
		r = r<<4 | rune(c)
	}
	return r
}

// skip validates and passes over the value at s.pos. With numbers set, a number that does not fit
// a float64 is a type error, as when the value is decoded into `any`.
func (s *scanner) skip(numbers bool) {
	base := len(s.stack)
	for s.err == nil {
		if s.skipScalarOrOpen(numbers) {
			continue // a container was entered: read its first element
		}
		// A value is complete: close the containers it completes and move to the next element.
		for s.err == nil {
			if len(s.stack) == base {
				return
			}
			closing := s.stack[len(s.stack)-1]
			if s.next(closing, false) {
				if closing == '}' {
					s.key()
				}
				break
			}
			s.stack = s.stack[:len(s.stack)-1]
		}
	}
}

// skipScalarOrOpen passes over the scalar at s.pos, or enters the container at s.pos and reports
// whether it holds an element to read next (s.pos then at that element's value).
func (s *scanner) skipScalarOrOpen(numbers bool) bool {
	switch c := s.peek(); {
	case c == '{' || c == '[':
		closing := byte(']')
		if c == '{' {
			closing = '}'
		}
		if !s.open() {
			return false
		}
		if !s.next(closing, true) {
			return false
		}
		s.stack = append(s.stack, closing)
		if closing == '}' {
			s.key()
		}
		return s.err == nil
	case c == '"':
		s.str()
	case c == 't':
		s.literal("true")
	case c == 'f':
		s.literal("false")
	case c == 'n':
		s.null()
	case c == '-' || isDigit(c):
		n := s.number()
		if numbers && n != nil {
			if _, err := strconv.ParseFloat(string(n), 64); err != nil {
				s.typeError("number " + string(n))
			} else if !exactInt(n) {
				s.floats++
			}
		}
	default:
		s.syntax()
	}
	return false
}
