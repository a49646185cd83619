package reqkey

import (
	"fmt"
	"strings"
)

// schema.go is the request schema reader: which fields of a chat, completion or generate body
// routing reads, of which JSON types, and what each value does to what was read before. It reads
// the body through the lexer (lexer.go) in one pass, so the bulk of a chat (its message texts) is
// touched once by the validating loop and once more when it is copied into the history key.
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
