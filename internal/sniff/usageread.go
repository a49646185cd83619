package sniff

import (
	"bytes"
	"encoding/json"
	"strconv"
)

// readUsageAt reads the usage object data starts with, as encoding/json would decode it into a
// UsageObject, without its reflection and allocations: every routed answer is read for its usage,
// and decoding it was a large share of a small request's cost. ok is false where encoding/json
// would fail: the object does not close, or a count is not an integer.
func readUsageAt(data []byte) (Tokens, bool) {
	obj, ok := objectAt(data)
	if !ok {
		return Tokens{}, false
	}
	var f usageFields
	r := jsonReader{b: obj}
	if !r.open() {
		return Tokens{}, false
	}
	for first := true; ; first = false {
		key, end, ok := r.nextKey(first)
		if !ok {
			return Tokens{}, false
		}
		if end {
			return f.tokens(), true
		}
		if !f.member(&r, key) {
			return Tokens{}, false
		}
	}
}

// usageFields holds what readUsageAt read, as the fields of a UsageObject would, each pointer
// field here a value with whether it was set (a JSON null unsets it).
type usageFields struct {
	prompt, input, cacheRead, cacheCreation counted
	promptCached, inputCached               counted // set: the details object is there
	completion, output                      int
}

// counted is an optional count.
type counted struct {
	n   int
	set bool
}

// ptr is c as UsageObject holds it.
func (c *counted) ptr() *int {
	if !c.set {
		return nil
	}
	return &c.n
}

// tokens is UsageObject.Tokens of the same object, so the two readings cannot drift apart.
func (f *usageFields) tokens() Tokens {
	u := UsageObject{PromptTokens: f.prompt.ptr(), InputTokens: f.input.ptr(), CacheRead: f.cacheRead.ptr(),
		CacheCreation: f.cacheCreation.ptr(), Completion: f.completion, Output: f.output}
	var promptDetails, inputDetails struct {
		CachedTokens int `json:"cached_tokens"`
	}
	if f.promptCached.set {
		promptDetails.CachedTokens = f.promptCached.n
		u.PromptTokensDetails = &promptDetails
	}
	if f.inputCached.set {
		inputDetails.CachedTokens = f.inputCached.n
		u.InputTokensDetails = &inputDetails
	}
	return u.Tokens()
}

// member reads the value of one member of the usage object. Keys match as encoding/json matches
// them: without regard to case, the last of repeated keys winning.
func (f *usageFields) member(r *jsonReader, key []byte) bool {
	switch {
	case bytes.EqualFold(key, []byte("prompt_tokens")):
		return r.optionalInt(&f.prompt)
	case bytes.EqualFold(key, []byte("input_tokens")):
		return r.optionalInt(&f.input)
	case bytes.EqualFold(key, []byte("cache_read_input_tokens")):
		return r.optionalInt(&f.cacheRead)
	case bytes.EqualFold(key, []byte("cache_creation_input_tokens")):
		return r.optionalInt(&f.cacheCreation)
	case bytes.EqualFold(key, []byte("completion_tokens")):
		return r.int(&f.completion)
	case bytes.EqualFold(key, []byte("output_tokens")):
		return r.int(&f.output)
	case bytes.EqualFold(key, []byte("prompt_tokens_details")):
		return r.details(&f.promptCached)
	case bytes.EqualFold(key, []byte("input_tokens_details")):
		return r.details(&f.inputCached)
	}
	return r.skip()
}

// jsonReader reads a span objectAt found to be one object with balanced brackets. It checks no
// more of JSON's grammar than the usage object's fields need: the spans it reads come from
// answers a worker sent, and what it cannot read it gives up on.
type jsonReader struct {
	b []byte
	i int
}

func (r *jsonReader) space() {
	for r.i < len(r.b) && (r.b[r.i] == ' ' || r.b[r.i] == '\t' || r.b[r.i] == '\r' || r.b[r.i] == '\n') {
		r.i++
	}
}

// next is the next byte after white space, 0 at the end.
func (r *jsonReader) next() byte {
	r.space()
	if r.i == len(r.b) {
		return 0
	}
	return r.b[r.i]
}

// open passes the brace that opens an object. Its members are then read in a loop of nextKey
// rather than by a callback, which would make every reader escape to the heap.
func (r *jsonReader) open() bool {
	if r.next() != '{' {
		return false
	}
	r.i++
	return true
}

// nextKey passes the comma before a member that is not the first, and the member's key and colon;
// end is true at the object's closing brace, passed.
func (r *jsonReader) nextKey(first bool) (key []byte, end, ok bool) {
	switch c := r.next(); {
	case c == '}':
		r.i++
		return nil, true, true
	case !first && c != ',':
		return nil, false, false
	case !first:
		r.i++
	}
	key, ok = r.key()
	if !ok || r.next() != ':' {
		return nil, false, false
	}
	r.i++
	r.space()
	return key, false, true
}

// key reads a member's key. A key with escapes is unescaped by encoding/json: workers write none.
func (r *jsonReader) key() ([]byte, bool) {
	if r.next() != '"' {
		return nil, false
	}
	start := r.i
	if !r.skipString() {
		return nil, false
	}
	raw := r.b[start:r.i]
	if bytes.IndexByte(raw, '\\') < 0 {
		return raw[1 : len(raw)-1], true
	}
	var key string
	if json.Unmarshal(raw, &key) != nil {
		return nil, false
	}
	return []byte(key), true
}

// skipString passes the string that starts at r.i.
func (r *jsonReader) skipString() bool {
	for r.i++; r.i < len(r.b); r.i++ {
		switch r.b[r.i] {
		case '\\':
			r.i++
		case '"':
			r.i++
			return true
		}
	}
	return false
}

// skip passes one value of any kind.
func (r *jsonReader) skip() bool {
	switch c := r.next(); c {
	case '"':
		return r.skipString()
	case '{', '[':
		depth := 0
		for ; r.i < len(r.b); r.i++ {
			switch r.b[r.i] {
			case '"':
				if !r.skipString() {
					return false
				}
				r.i--
			case '{', '[':
				depth++
			case '}', ']':
				if depth--; depth == 0 {
					r.i++
					return true
				}
			}
		}
		return false
	case 0:
		return false
	default:
		return r.literal() != nil
	}
}

// literal passes a number, true, false or null and returns it.
func (r *jsonReader) literal() []byte {
	start := r.i
	for r.i < len(r.b) {
		switch r.b[r.i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return r.b[start:r.i]
		}
		r.i++
	}
	return nil
}

// isNull passes a null if one is next.
func (r *jsonReader) isNull() bool {
	if bytes.HasPrefix(r.b[r.i:], []byte("null")) {
		r.i += len("null")
		return true
	}
	return false
}

// int reads an integer into n; a null leaves n as it was, as encoding/json does for an int.
func (r *jsonReader) int(n *int) bool {
	if r.isNull() {
		return true
	}
	v, err := strconv.ParseInt(string(r.literal()), 10, 64)
	*n = int(v)
	return err == nil
}

// optionalInt reads an integer or a null (which unsets c).
func (r *jsonReader) optionalInt(c *counted) bool {
	if r.isNull() {
		*c = counted{}
		return true
	}
	c.set = true
	return r.int(&c.n)
}

// details reads a *_tokens_details object's cached_tokens into c, which it sets; a null unsets c.
// A repeated details object reads into the first, as encoding/json reads into the struct a
// pointer already points to.
func (r *jsonReader) details(c *counted) bool {
	if r.isNull() {
		*c = counted{}
		return true
	}
	if !c.set {
		*c = counted{set: true}
	}
	if !r.open() {
		return false
	}
	for first := true; ; first = false {
		key, end, ok := r.nextKey(first)
		if end || !ok {
			return ok
		}
		if bytes.EqualFold(key, []byte("cached_tokens")) {
			ok = r.int(&c.n)
		} else {
			ok = r.skip()
		}
		if !ok {
			return false
		}
	}
}
