package protocol

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync/atomic"
)

// schema.go holds the typed field readers every protocol's body reader (chat.go, responses.go,
// messages.go) is made of: each reads one value through the lexer (lexer.go), checks its JSON
// type, and records a type error that names the field when it has another; parseObject reads a
// whole body, in one pass that checks all of it.

// maxFloatLen is the longest canonical form of a number (see number): 17 significant digits,
// a sign, a point and up to six zeros after it, or an exponent.
const maxFloatLen = 25

// parses counts the bodies parseObject has read (see Parses).
var parses atomic.Uint64

// Parses is how many request bodies this package has parsed since the process started. A routed
// request's body is parsed once, whatever its route derives or renders from it (its keys, its
// /tokenize query): the router's tests hold it to that.
func Parses() uint64 { return parses.Load() }

// parseObject reads the request body data, which must be a JSON object, calling member with each
// of its members' keys and the scanner at the value. A body that is empty, not an object or
// malformed is an *Error, as is the first field member finds of the wrong type.
func parseObject(data []byte, member func(*scanner, []byte)) *Error {
	parses.Add(1)
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

// roleSize is the key's bytes for the role given as raw, whose value takes at most n bytes.
func roleSize(raw []byte, n int) int {
	switch string(raw) {
	case "system", "developer", "user", "assistant", "tool":
		return 1
	}
	return 1 + fieldSize(n)
}

// objectElement reports whether the element at s.pos, typed as an object, is one; null is read,
// and another type is a type error.
func (s *scanner) objectElement() bool {
	switch s.peek() {
	case '{':
		return true
	case 'n':
		s.null()
	default:
		s.mismatch()
	}
	return false
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

// strBound reads the string at s.pos and returns the bytes between its quotes and the most bytes
// the key takes of its value (see grow).
func (s *scanner) strBound() (raw []byte, n int) {
	grow := s.grow
	raw, _, _ = s.str()
	return raw, len(raw) + s.grow - grow
}

// stringField reads a string-typed field: null leaves it as it is, another type is a type error.
// For a string it returns its contents, the most bytes its value takes, and true.
func (s *scanner) stringField(name string) (raw []byte, n int, ok bool) {
	s.in(name)
	switch s.peek() {
	case '"':
		raw, n = s.strBound()
		ok = s.err == nil
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

func (s *scanner) out() { s.path = s.path[:len(s.path)-1] }

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
