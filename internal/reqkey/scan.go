package reqkey

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf16"
	"unicode/utf8"
)

// scan.go reads a request body in one pass: it checks the whole document against the JSON grammar
// exactly as strictly as encoding/json does, and keeps only the fields routing reads. Everything
// else is validated and skipped without being built. Strings without escapes or invalid UTF-8 are
// kept as sub-slices of the body, so the bulk of a chat (its message texts) is touched once by the
// validating loop and once more when it is copied into the history key.
//
// The decoding rules are those of encoding/json decoding into the types this package used before
// (see reference_test.go), with one deliberate change: object keys are matched exactly, where
// encoding/json also accepted any case-insensitive spelling ("Model", "USER").
//
//   - A value of the wrong JSON type for a typed field is a type error; the scan goes on, and the
//     first type error is reported unless the document is malformed, which is reported first.
//   - null leaves a string field (role, name, ...) or an array element as it was, and clears
//     model, stream, an array field (messages, tools, tool_calls) or a free-form value.
//   - A repeated key is decoded again over what the earlier one left: a later scalar replaces an
//     earlier one, and an array of objects is decoded element by element over the earlier elements
//     (see decodeArray), as encoding/json decodes into an existing slice.
//   - Free-form values (content, arguments, parameters, prompt, text, input_ids) fail on a number
//     that does not fit a float64, as decoding them into `any` does.

// maxDepth is the deepest nesting of arrays and objects accepted, encoding/json's limit.
const maxDepth = 10000

// body holds the top-level fields routing reads. Byte slices may point into the request body.
type body struct {
	model    []byte
	stream   bool
	messages []message // nil when absent or null: not a chat
	tools    []tool
	// prompt, text and inputIDs are the raw JSON of the last such value, rendered on demand.
	prompt, text, inputIDs []byte
	// paramsID is session_params.session_id, empty unless the last session_params is an object.
	paramsID, sessionID, userID, user []byte
}

// scanner is the reading position in one JSON document and what went wrong so far.
type scanner struct {
	data    []byte
	pos     int
	depth   int
	err     *Error   // the document is malformed: scanning stops
	typeErr *Error   // the first field of the wrong type: scanning goes on
	path    []string // the names of the typed fields being read, for type errors
	stack   []byte   // closing bytes of the containers skip is inside
}

// parseBody reads the JSON object in data into b.
func parseBody(data []byte, b *body) *Error {
	s := scanner{data: data}
	s.ws()
	s.object(b.member)
	if s.err == nil {
		s.ws()
		if s.pos < len(s.data) {
			s.syntax()
		}
	}
	if s.err != nil {
		return s.err
	}
	return s.typeErr
}

// member reads one top-level member whose key has been read.
func (b *body) member(s *scanner, key []byte) {
	switch string(key) {
	case "model":
		s.in("model")
		switch s.peek() {
		case '"':
			b.model = s.stringValue()
		case 'n':
			s.null()
			b.model = nil
		default:
			s.mismatch()
		}
		s.out()
	case "stream":
		s.in("stream")
		switch s.peek() {
		case 't':
			b.stream = s.literal("true")
		case 'f':
			s.literal("false")
			b.stream = false
		case 'n':
			s.null()
			b.stream = false
		default:
			s.mismatch()
		}
		s.out()
	case "messages":
		s.in("messages")
		switch s.peek() {
		case '[':
			b.messages = decodeArray(s, b.messages, (*message).decode)
		case 'n':
			s.null()
			b.messages = nil
		default:
			s.mismatch()
		}
		s.out()
	case "tools":
		s.in("tools")
		switch s.peek() {
		case '[':
			b.tools = decodeArray(s, b.tools, (*tool).decode)
		case 'n':
			s.null()
			b.tools = nil
		default:
			s.mismatch()
		}
		s.out()
	case "prompt":
		b.prompt = s.freeForm("prompt")
	case "text":
		b.text = s.freeForm("text")
	case "input_ids":
		b.inputIDs = s.freeForm("input_ids")
	case "session_params":
		b.paramsID = nil
		if s.peek() != '{' {
			s.skip(false)
			return
		}
		s.object(func(s *scanner, key []byte) {
			if string(key) == "session_id" {
				s.id(&b.paramsID)
			} else {
				s.skip(false)
			}
		})
	case "session_id":
		s.id(&b.sessionID)
	case "user_id":
		s.id(&b.userID)
	case "user":
		s.id(&b.user)
	default:
		s.skip(false)
	}
}

// decode reads one element of messages over m.
func (m *message) decode(s *scanner) {
	s.structValue(func(s *scanner, key []byte) {
		switch string(key) {
		case "role":
			s.stringField("role", &m.role)
		case "name":
			s.stringField("name", &m.name)
		case "tool_call_id":
			s.stringField("tool_call_id", &m.toolCallID)
		case "content":
			s.in("content")
			m.text, m.parts = s.content()
			s.out()
		case "tool_calls":
			s.in("tool_calls")
			switch s.peek() {
			case '[':
				m.toolCalls = decodeArray(s, m.toolCalls, (*toolCall).decode)
			case 'n':
				s.null()
				m.toolCalls = nil
			default:
				s.mismatch()
			}
			s.out()
		default:
			s.skip(false)
		}
	})
}

// decode reads one element of tool_calls over c.
func (c *toolCall) decode(s *scanner) {
	s.function(func(s *scanner, key []byte) {
		switch string(key) {
		case "name":
			s.stringField("name", &c.name)
		case "arguments":
			if s.peek() == '"' {
				c.args, c.argsJSON = s.stringValue(), false
			} else {
				c.args, c.argsJSON = s.freeForm("arguments"), true
			}
		default:
			s.skip(false)
		}
	})
}

// decode reads one element of tools over t.
func (t *tool) decode(s *scanner) {
	s.function(func(s *scanner, key []byte) {
		switch string(key) {
		case "name":
			s.stringField("name", &t.name)
		case "description":
			s.stringField("description", &t.description)
		case "parameters":
			t.params = s.freeForm("parameters")
		default:
			s.skip(false)
		}
	})
}

// function reads an object of the shape {"function": {...}} (a tool, a tool call): member reads
// the inner object's members; every other member is validated and skipped.
func (s *scanner) function(member func(*scanner, []byte)) {
	s.structValue(func(s *scanner, key []byte) {
		if string(key) != "function" {
			s.skip(false)
			return
		}
		s.in("function")
		s.structValue(member)
		s.out()
	})
}

// content reads a message content: a string, or an array whose string elements and text parts
// carry text. It returns the string and the non-empty texts of the array's parts.
func (s *scanner) content() (text []byte, parts [][]byte) {
	switch s.peek() {
	case '"':
		return s.stringValue(), nil
	case '[':
	default:
		s.skip(true)
		return nil, nil
	}
	if !s.open() {
		return nil, nil
	}
	for first := true; s.next(']', first); first = false {
		var t []byte
		switch s.peek() {
		case '"':
			t = s.stringValue()
		case '{':
			t = s.part()
		default:
			s.skip(true)
		}
		if len(t) > 0 {
			parts = append(parts, t)
		}
		if s.err != nil {
			break
		}
	}
	return nil, parts
}

// part reads a content part object and returns its text when it is a text part: one with a
// string "text" and a "type" that is absent, not a string, empty, "text" or "input_text".
func (s *scanner) part() []byte {
	var typ, text []byte
	textOK := false
	s.object(func(s *scanner, key []byte) {
		switch string(key) {
		case "type":
			typ = nil
			if s.peek() == '"' {
				typ = s.stringValue()
			} else {
				s.skip(true)
			}
		case "text":
			textOK = s.peek() == '"'
			if textOK {
				text = s.stringValue()
			} else {
				s.skip(true)
			}
		default:
			s.skip(true)
		}
	})
	if !textOK || (len(typ) > 0 && string(typ) != "text" && string(typ) != "input_text") {
		return nil
	}
	return text
}

// decodeArray decodes a JSON array into v the way encoding/json decodes into a Go slice: element i
// is decoded over what v already holds there (a repeated key merges into the earlier elements,
// even ones a shorter repeat cut off but left in the backing array), the result is cut to the
// array's length, and an empty array gives an empty, non-nil slice.
func decodeArray[T any](s *scanner, v []T, decode func(*T, *scanner)) []T {
	if !s.open() {
		return v
	}
	n := 0
	for first := true; s.next(']', first); first = false {
		switch {
		case n >= cap(v): // then len(v) == cap(v) == n
			if cap(v) == 0 {
				v = make([]T, 0, 8) // skip the smallest steps of growing one element at a time
			}
			var zero T
			v = append(v, zero)
		case n >= len(v):
			v = v[:n+1]
		}
		decode(&v[n], s)
		n++
		if s.err != nil {
			return v
		}
	}
	if n == 0 {
		return []T{}
	}
	return v[:n]
}

// structValue reads an object into a struct-typed field, calling member for each of its members;
// null leaves the field as it is, and any other type is a type error.
func (s *scanner) structValue(member func(*scanner, []byte)) {
	switch s.peek() {
	case '{':
		s.object(member)
	case 'n':
		s.null()
	default:
		s.mismatch()
	}
}

// stringField reads a string-typed field: null leaves it as it is, another type is a type error.
func (s *scanner) stringField(name string, dst *[]byte) {
	s.in(name)
	switch s.peek() {
	case '"':
		*dst = s.stringValue()
	case 'n':
		s.null()
	default:
		s.mismatch()
	}
	s.out()
}

// id reads a session or user id: a string is decoded, a number is kept as written, and any other
// value leaves dst as it was.
func (s *scanner) id(dst *[]byte) {
	switch c := s.peek(); {
	case c == '"':
		*dst = s.stringValue()
	case c == '-' || isDigit(c):
		*dst = s.number()
	default:
		s.skip(false)
	}
}

// freeForm reads a value of any type and returns its raw JSON, or nil for null. Its numbers must
// fit a float64, as they would to be decoded into `any`.
func (s *scanner) freeForm(name string) []byte {
	s.in(name)
	start := s.pos
	s.skip(true)
	s.out()
	raw := s.data[start:s.pos]
	if string(raw) == "null" {
		return nil
	}
	return raw
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

// in and out push and pop the name of the typed field being read.
func (s *scanner) in(name string) { s.path = append(s.path, name) }
func (s *scanner) out()           { s.path = s.path[:len(s.path)-1] }

// mismatch records a type error for the value at s.pos and skips it.
func (s *scanner) mismatch() {
	kind := "number"
	switch s.peek() {
	case '{':
		kind = "object"
	case '[':
		kind = "array"
	case '"':
		kind = "string"
	case 't', 'f':
		kind = "bool"
	}
	s.typeError(kind)
	s.skip(false)
}

func (s *scanner) typeError(value string) {
	if s.typeErr == nil {
		s.typeErr = &Error{fmt.Sprintf("invalid JSON body: field %q must not be a JSON %s", strings.Join(s.path, "."), value)}
	}
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

// key reads an object key and the colon after it, leaving s.pos at the value.
func (s *scanner) key() []byte {
	if s.peek() != '"' {
		s.syntax()
		return nil
	}
	k := s.stringValue()
	s.ws()
	if s.peek() != ':' {
		s.syntax()
		return nil
	}
	s.pos++
	s.ws()
	return k
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
// escape, and whether they hold a byte outside ASCII.
func (s *scanner) str() (raw []byte, escaped, high bool) {
	d := s.data
	start := s.pos + 1
	i := start
	for {
		for i+8 <= len(d) && !special8(binary.LittleEndian.Uint64(d[i:])) {
			i += 8
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
			i++
		}
	}
}

const (
	ones  = 0x0101010101010101
	highs = 0x8080808080808080
)

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
	b := make([]byte, 0, len(s)+utf8.UTFMax)
	for r := 0; r < len(s); {
		c := s[r]
		switch {
		case c == '\\':
			if s[r+1] == 'u' {
				rr := hex4(s[r+2:])
				r += 6
				if utf16.IsSurrogate(rr) {
					rr1 := rune(-1)
					if r+6 <= len(s) && s[r] == '\\' && s[r+1] == 'u' {
						rr1 = hex4(s[r+2:])
					}
					if dec := utf16.DecodeRune(rr, rr1); dec != unicode.ReplacementChar {
						b = utf8.AppendRune(b, dec)
						r += 6
						continue
					}
					rr = unicode.ReplacementChar
				}
				b = utf8.AppendRune(b, rr)
				continue
			}
			b = append(b, unescape(s[r+1]))
			r += 2
		case c < utf8.RuneSelf:
			b = append(b, c)
			r++
		default:
			rr, size := utf8.DecodeRune(s[r:])
			b = utf8.AppendRune(b, rr)
			r += size
		}
	}
	return b
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
			}
		}
	default:
		s.syntax()
	}
	return false
}
