package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// schema.go is the request schema reader: which fields of a chat, completion or generate body
// routing reads, of which JSON types, and what each value does to what was read before. It reads
// the body through the lexer (lexer.go) in one pass that checks all of it. Of a chat's messages
// and tools it keeps only where their arrays are, and a bound on the size of the key they make:
// the history key (history.go) reads them again from the body, in one pass into a buffer of that
// size, so that a body of many small parts costs no memory per part.
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
//     (see arrays), as encoding/json decodes into an existing slice.
//   - Free-form values (content, arguments, parameters, prompt, text, input_ids) fail on a number
//     that does not fit a float64, as decoding them into `any` does.

// body holds the top-level fields routing reads. Byte slices may point into the request body.
type body struct {
	model  []byte
	stream bool
	// max_tokens and max_completion_tokens, for the rate limits: the larger counts.
	maxTokens, maxCompletionTokens int
	// messages and tools are where the arrays given for them are; nil when absent or null. A
	// body whose messages is nil is not a chat.
	messages, tools *arrays
	// prompt, text and inputIDs are the last such value, rendered on demand.
	prompt, text, inputIDs prompt
	// paramsID is session_params.session_id, empty unless the last session_params is an object.
	paramsID, sessionID, userID, user []byte
}

// arrays is a field whose value is an array of objects (messages, tools) given once or more:
// where the first non-empty array given since the field was last cleared (by null or by an empty
// array) is, and how many were given since. Element i of the field is element i of each of them,
// each decoded over what the earlier ones left (see valid.fold), as encoding/json decodes a
// repeated key into the same Go slice. Only positions are kept: the history key reads the
// elements again from the body, finding the later arrays by their key.
type arrays struct {
	data     []byte
	name     string // the field's key
	first    int    // the position of the first array
	n        int    // how many arrays
	keyBound        // of the elements of all of them
}

// keyBound is what checking the elements of a messages or tools array learns of the history key
// they make, so that it can be written in one pass into a buffer of the right size (see
// historyKey) rather than counted first. Each element's bound covers what the key can take of it
// whichever element of the array field it is folded into (see valid.fold): the framing of one
// whole element, and the tag and end of each text field it holds, as many times as it is given.
type keyBound struct {
	size    int // the most bytes the key of the elements may take
	named   int // the most tools with a name among them
	members int // the most object members of a value the key writes in canonical form
	// inOrder says that each message has each of its fields once, in the order they are
	// written: role, name and tool_call_id before content, and content before tool_calls. Its
	// content can then be written as it is read.
	inOrder bool
}

// maxFloatLen is the longest canonical form of a number (see number): 17 significant digits,
// a sign, a point and up to six zeros after it, or an exponent.
const maxFloatLen = 25

// parseBody reads the JSON object in data into b.
func parseBody(data []byte, b *body) *Error { return parseObject(data, b.member) }

// parseObject reads the request body data, which must be a JSON object, calling member with each
// of its members' keys and the scanner at the value. A body that is empty, not an object or
// malformed is an *Error, as is the first field member finds of the wrong type.
func parseObject(data []byte, member func(*scanner, []byte)) *Error {
	trimmed := bytes.TrimLeft(data, " \t\r\n")
	if len(trimmed) == 0 {
		return &Error{"request body is empty; expected a JSON object"}
	}
	if trimmed[0] != '{' {
		return &Error{"request body must be a JSON object"}
	}
	s := scanner{data: data}
	s.ws()
	s.object(member)
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
		s.nullableString("model", &b.model)
	case "stream":
		b.stream = s.boolean("stream", false)
	case "messages":
		b.messages = s.arrayField("messages", b.messages, checkMessage)
	case "tools":
		b.tools = s.arrayField("tools", b.tools, checkTool)
	case "prompt":
		b.prompt = s.prompt("prompt")
	case "text":
		b.text = s.prompt("text")
	case "input_ids":
		b.inputIDs = s.prompt("input_ids")
	case "max_tokens":
		b.maxTokens = s.tokenCount()
	case "max_completion_tokens":
		b.maxCompletionTokens = s.tokenCount()
	case "session_params":
		s.idIn("session_id", &b.paramsID)
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

// nullableString reads a string field that null clears into *dst; another type is a type error.
func (s *scanner) nullableString(name string, dst *[]byte) {
	s.in(name)
	switch s.peek() {
	case '"':
		*dst = s.stringValue()
	case 'n':
		s.null()
		*dst = nil
	default:
		s.mismatch()
	}
	s.out()
}

// boolean reads a bool field and returns its value, or null's for null. Another type is a type
// error.
func (s *scanner) boolean(name string, null bool) bool {
	s.in(name)
	v := null
	switch s.peek() {
	case 't':
		v = s.literal("true")
	case 'f':
		s.literal("false")
		v = false
	case 'n':
		s.null()
	default:
		s.mismatch()
	}
	s.out()
	return v
}

// maxTokenCount bounds the token counts read (max_tokens and its kin).
const maxTokenCount = 1 << 30

// tokenCount reads a count of output tokens a request asks for (max_tokens and its kin), for the
// rate limits' estimate only: a JSON number, truncated and clamped to [0, maxTokenCount]. Any
// other value is passed over as 0: the worker judges the request, the router only estimates it.
func (s *scanner) tokenCount() int {
	if c := s.peek(); c != '-' && !isDigit(c) {
		s.skip(false)
		return 0
	}
	return clampTokens(s.number())
}

// clampTokens is the count a JSON number stands for, as tokenCount reads it.
func clampTokens(num []byte) int {
	v, err := strconv.ParseFloat(string(num), 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange), !(v > 0):
		return 0
	case v >= maxTokenCount:
		return maxTokenCount
	}
	return int(v)
}

// idIn reads an object that holds an id under the key name (session_params, metadata): each such
// object replaces the id of the one before, and any other value leaves none.
func (s *scanner) idIn(name string, dst *[]byte) {
	*dst = nil
	if s.peek() != '{' {
		s.skip(false)
		return
	}
	s.object(func(s *scanner, key []byte) {
		if string(key) == name {
			s.id(dst)
		} else {
			s.skip(false)
		}
	})
}

// arrayField reads an array of objects given for the field a, whose elements check reads, and
// returns what the field is then.
func (s *scanner) arrayField(name string, a *arrays, check func(*scanner)) *arrays {
	s.in(name)
	switch s.peek() {
	case '[':
		start := s.pos
		s.hist = keyBound{inOrder: true}
		n := s.array(check)
		if a == nil {
			a = &arrays{data: s.data, name: name}
		}
		switch {
		case n == 0:
			a.n, a.keyBound = 0, keyBound{} // an empty array decodes into a new, empty slice
		case a.n == 0:
			a.first, a.n = start, 1
			a.keyBound = s.hist
		default:
			a.n++
			a.size += s.hist.size
			a.named += s.hist.named
			a.members = max(a.members, s.hist.members)
			a.inOrder = false // its elements are read over those of the first
		}
	case 'n':
		s.null()
		a = nil
	default:
		s.mismatch()
	}
	s.out()
	return a
}

// The fields of a message, in the order the history key writes them.
const (
	seenRole uint8 = 1 << iota
	seenName
	seenID
	seenContent
	seenCalls
)

// checkMessage reads one element of messages: the fields the history key reads must be of their
// types. Their values are read again when the key is written.
func checkMessage(s *scanner) {
	var seen uint8
	roles := -1 // the key's bytes for the roles given, -1 for none
	s.structValue(func(s *scanner, key []byte) {
		switch string(key) {
		case "role":
			s.see(&seen, seenRole)
			if raw, n, ok := s.stringField("role"); ok {
				roles = max(roles, 0) + roleSize(raw, n)
			}
		case "name":
			s.see(&seen, seenName)
			s.taggedString("name")
		case "tool_call_id":
			s.see(&seen, seenID)
			s.taggedString("tool_call_id")
		case "content":
			s.see(&seen, seenContent)
			s.content()
		case "tool_calls":
			s.see(&seen, seenCalls)
			s.in("tool_calls")
			switch s.peek() {
			case '[':
				s.array(checkToolCall)
			case 'n':
				s.null()
			default:
				s.mismatch()
			}
			s.out()
		default:
			s.skip(false)
		}
	})
	if roles < 0 {
		roles = len("r") + fieldSize(0) // no role: the empty one, unless an element read before gives one
	}
	s.hist.size += roles + len(".")
}

// see notes that the message field f is read after the fields in seen, and whether the message
// is still in order: f is not repeated, nor read after a field written after it.
func (s *scanner) see(seen *uint8, f uint8) {
	after := seenContent | seenCalls // the fields written after f
	switch f {
	case seenContent:
		after = seenCalls
	case seenCalls:
		after = 0
	}
	if *seen&(f|after) != 0 {
		s.hist.inOrder = false
	}
	*seen |= f
}

// roleSize is the key's bytes for the role given as raw, whose value takes at most n bytes.
func roleSize(raw []byte, n int) int {
	switch string(raw) {
	case "system", "developer", "user", "assistant", "tool":
		return 1
	}
	return 1 + fieldSize(n)
}

// taggedString reads a string field the key writes as a field behind a tag, when it is not empty.
func (s *scanner) taggedString(name string) {
	if raw, n, ok := s.stringField(name); ok && len(raw) > 0 {
		s.hist.size += 1 + fieldSize(n)
	}
}

// content reads a message's content, of any type. The key writes its text: the content when it is
// a string, or the strings and text parts of a content array. This reads what encoding/json's
// decoding of the content into `any` does, validating the value as freeForm does.
func (s *scanner) content() {
	s.in("content")
	switch s.peek() {
	case '"':
		s.taggedText()
	case '[':
		s.array(func(s *scanner) {
			switch s.peek() {
			case '"':
				s.taggedText()
			case '{':
				s.object(func(s *scanner, key []byte) {
					if string(key) == "text" && s.peek() == '"' {
						s.taggedText()
					} else {
						s.skip(true)
					}
				})
			default:
				s.skip(true)
			}
		})
	default:
		s.skip(true)
	}
	s.out()
}

// taggedText reads a string of content that the key may write as a text part.
func (s *scanner) taggedText() {
	grow := s.grow
	raw, _, _ := s.str()
	if len(raw) > 0 {
		s.hist.size += 1 + fieldSize(len(raw)+s.grow-grow)
	}
}

// checkToolCall reads one element of tool_calls.
func checkToolCall(s *scanner) {
	s.hist.size += len("f") + 2*fieldSize(0) // the call, with no name and no arguments
	s.function(func(s *scanner, key []byte) {
		switch string(key) {
		case "name":
			if _, n, ok := s.stringField("name"); ok {
				s.hist.size += fieldSize(n)
			}
		case "arguments":
			s.canonical("arguments") // a string, or the object some clients send
		default:
			s.skip(false)
		}
	})
}

// checkTool reads one element of tools.
func checkTool(s *scanner) {
	s.hist.size += len("T") + 3*fieldSize(0) // the tool, with no name, description or parameters
	s.function(func(s *scanner, key []byte) {
		switch string(key) {
		case "name":
			if raw, n, ok := s.stringField("name"); ok {
				s.hist.size += fieldSize(n)
				if len(raw) > 0 {
					s.hist.named++
				}
			}
		case "description":
			if _, n, ok := s.stringField("description"); ok {
				s.hist.size += fieldSize(n)
			}
		case "parameters":
			s.canonical("parameters")
		default:
			s.skip(false)
		}
	})
}

// prompt reads a free-form value that may be rendered as routing text (see routingText).
func (s *scanner) prompt(name string) prompt {
	grow, floats := s.grow, s.floats
	raw := s.freeForm(name)
	return prompt{raw: raw, size: len(raw) + s.grow - grow + maxRenderedFloatLen*(s.floats-floats)}
}

// canonical reads a free-form value the key writes in canonical form as a field (or, a tool
// call's arguments, as the string it is).
func (s *scanner) canonical(name string) {
	grow, floats, keys := s.grow, s.floats, s.keys
	if raw := s.freeForm(name); raw != nil {
		s.hist.size += fieldSize(len(raw) + s.grow - grow + maxFloatLen*(s.floats-floats))
		s.hist.members = max(s.hist.members, s.keys-keys)
	}
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
// For a string it returns its contents, the most bytes its value takes, and true.
func (s *scanner) stringField(name string) (raw []byte, n int, ok bool) {
	s.in(name)
	switch s.peek() {
	case '"':
		grow := s.grow
		raw, _, _ = s.str()
		n, ok = len(raw)+s.grow-grow, s.err == nil
	case 'n':
		s.null()
	default:
		s.mismatch()
	}
	s.out()
	return raw, n, ok
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
