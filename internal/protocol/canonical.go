package protocol

import (
	"bytes"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// canonical.go writes a free-form JSON value of a chat (a tool's parameters, a tool call's
// arguments given as an object) in canonical form, so that the same schema always yields the same
// key whatever order its client wrote it in. The canonical form is what encoding/json writes when
// it encodes the value it decoded into `any`: object keys sorted, a repeated key's last value
// kept, numbers as float64, strings escaped anew. It is written from the body: the only memory it
// takes is eight bytes per object member of the value, reused from one value to the next.

// canonicalizer writes values in canonical form. Its scratch space is kept between values.
type canonicalizer struct {
	v     valid
	start int // where the value being written starts: members hold offsets from it
	// hint says to leave out the value's own cache_control member, when it is an object: a
	// caching hint that Messages clients move from block to block turn by turn (see hintKey).
	hint bool
	recs []member // every object member in the value, in document order
	open []uint32 // while collecting: for each container entered, its last member so far
}

// member is an object member of the value being written: where its key is, and which member of
// the same object follows it (a 1-based index into recs, 0 for none). The links are sorted by key
// in place when the object is written.
type member struct {
	key, next uint32
}

// compactLimit is the longest value whose positions fit a member; longer ones (only possible in
// bodies over 4 GiB) are decoded with encoding/json instead.
var compactLimit = math.MaxUint32

const inArray = math.MaxUint32 // an open entry for an array, which has no members

// hintKey is the member a block, an item or a tool is written without: the marker of where a
// prompt cache breakpoint is, which says nothing of the prompt.
const hintKey = "cache_control"

// write writes the canonical form of the value at i; null (the value's absence) writes nothing.
func (c *canonicalizer) write(w *keyWriter, i int) {
	if c.v[i] == 'n' {
		return
	}
	if len(c.v)-i > compactLimit {
		end := c.v.skip(i)
		w.write(canonicalJSON(c.v[i:end], c.hint))
		return
	}
	c.start = i
	c.collect(i)
	c.value(w, i)
}

// collect records every object member of the value at i in c.recs, in document order, each
// linked to the next member of its object. recs is sized by the canonicalizer's user, from the
// members the lexer counted in the largest value (see keyBound): grown by appending it would
// allocate several times its size.
func (c *canonicalizer) collect(i int) {
	c.recs, c.open = c.recs[:0], c.open[:0]
	wantKey := false
	for j := i; ; {
		switch c.v[j] {
		case '"':
			if wantKey {
				c.recs = append(c.recs, member{key: uint32(j - c.start)})
				idx := uint32(len(c.recs))
				if last := c.open[len(c.open)-1]; last != 0 {
					c.recs[last-1].next = idx
				}
				c.open[len(c.open)-1] = idx
				wantKey = false
			}
			j = c.v.strEnd(j)
		case '{':
			c.open = append(c.open, 0)
			wantKey = true
			j++
		case '[':
			c.open = append(c.open, inArray)
			j++
		case '}', ']':
			c.open = c.open[:len(c.open)-1]
			j++
		case ',':
			wantKey = c.open[len(c.open)-1] != inArray
			j++
		default:
			j++
		}
		if len(c.open) == 0 {
			return // the end of the value, or of its first token: a scalar has no members
		}
	}
}

// value writes the canonical form of the value at i and returns the position after it.
func (c *canonicalizer) value(w *keyWriter, i int) int {
	switch c.v[i] {
	case '"':
		s, end := c.v.str(i)
		quote(w, s)
		return end
	case '{':
		return c.object(w, i)
	case '[':
		w.byte('[')
		pos, more := c.v.first(i)
		for n := 0; more; n++ {
			if n > 0 {
				w.byte(',')
			}
			pos, more = c.v.next(c.value(w, pos))
		}
		w.byte(']')
		return pos
	case 't':
		w.writeString("true")
		return i + len("true")
	case 'f':
		w.writeString("false")
		return i + len("false")
	case 'n':
		w.writeString("null")
		return i + len("null")
	}
	end := i
	for end < len(c.v) && !delimiter[c.v[end]] {
		end++
	}
	number(w, c.v[i:end])
	return end
}

// object writes the object at i with its members sorted by key, keeping the last of a repeated
// key, and returns the position after it.
func (c *canonicalizer) object(w *keyWriter, i int) int {
	pos, ok := c.v.first(i)
	if !ok {
		w.writeString("{}")
		return pos
	}
	k, _ := slices.BinarySearchFunc(c.recs, uint32(pos-c.start), func(m member, key uint32) int {
		return int(m.key) - int(key)
	})
	w.byte('{')
	end, n := 0, 0
	hint := c.hint && i == c.start
	for m := c.sort(uint32(k) + 1); m != 0; m = c.recs[m-1].next {
		key, val := c.v.member(c.start + int(c.recs[m-1].key))
		var valEnd int
		if next := c.recs[m-1].next; next != 0 && c.compare(m, next) == 0 {
			valEnd = c.v.skip(val) // a later member has the same key: this one is dropped
		} else if hint && key.is(hintKey) {
			valEnd = c.v.skip(val)
		} else {
			if n > 0 {
				w.byte(',')
			}
			n++
			quote(w, key)
			w.byte(':')
			valEnd = c.value(w, val)
		}
		end = max(end, valEnd)
	}
	w.byte('}')
	return c.v.ws(end) + 1
}

// compare compares the keys of members a and b (1-based).
func (c *canonicalizer) compare(a, b uint32) int {
	i, k := c.start+int(c.recs[a-1].key)+1, c.start+int(c.recs[b-1].key)+1
	// Most keys are plain ASCII: compare them where they are, up to the first difference.
	for ; c.v[i] == c.v[k]; i, k = i+1, k+1 {
		if c.v[i] == '"' {
			return 0
		}
		if c.v[i] == '\\' || c.v[i] >= utf8.RuneSelf {
			break
		}
	}
	ci, ck := c.v[i], c.v[k]
	switch {
	case ci == '\\' || ck == '\\' || ci >= utf8.RuneSelf || ck >= utf8.RuneSelf:
		ka, _ := c.v.str(c.start + int(c.recs[a-1].key))
		kb, _ := c.v.str(c.start + int(c.recs[b-1].key))
		return compareJstr(ka, kb)
	case ci == '"':
		return -1
	case ck == '"':
		return 1
	case ci < ck:
		return -1
	}
	return 1
}

// sort sorts the list of members that starts at head by key, keeping members with the same key in
// document order, and returns its new head. It merges the list's sorted runs pairwise in place,
// with no memory beyond the links, so an object whose keys are already sorted takes one pass.
func (c *canonicalizer) sort(head uint32) uint32 {
	for {
		var sorted, tail uint32
		merges := 0
		for p := head; p != 0; merges++ {
			q := c.cutRun(p)
			rest := uint32(0)
			if q != 0 {
				rest = c.cutRun(q)
			}
			h, t := c.merge(p, q)
			if tail == 0 {
				sorted = h
			} else {
				c.recs[tail-1].next = h
			}
			tail, p = t, rest
		}
		head = sorted
		if merges <= 1 {
			return head
		}
	}
}

// cutRun ends the list at p after its first sorted run and returns the rest.
func (c *canonicalizer) cutRun(p uint32) uint32 {
	for {
		next := c.recs[p-1].next
		if next == 0 {
			return 0
		}
		if c.compare(p, next) > 0 {
			c.recs[p-1].next = 0
			return next
		}
		p = next
	}
}

// merge merges the sorted lists p and q, taking from p first on equal keys, and returns the
// merged list's head and tail.
func (c *canonicalizer) merge(p, q uint32) (head, tail uint32) {
	for p != 0 || q != 0 {
		var e uint32
		if q == 0 || (p != 0 && c.compare(p, q) <= 0) {
			e, p = p, c.recs[p-1].next
		} else {
			e, q = q, c.recs[q-1].next
		}
		if tail == 0 {
			head = e
		} else {
			c.recs[tail-1].next = e
		}
		tail = e
	}
	return head, tail
}

// quote writes the value of the string j as encoding/json encodes a string without HTML escaping.
func quote(w *keyWriter, j jstr) {
	// A string without escapes and of valid UTF-8 holds no character encoding/json escapes,
	// unless U+2028 or U+2029, whose first byte is 0xe2: it is written as it is.
	if j.plain && bytes.IndexByte(j.raw, 0xe2) < 0 {
		w.byte('"')
		w.write(j.raw)
		w.byte('"')
		return
	}
	w.byte('"')
	raw := j.raw
	for i := 0; i < len(raw); {
		// Copy the longest run of bytes written as they are, then write one character.
		start := i
		for i < len(raw) {
			if c := raw[i]; c < utf8.RuneSelf {
				if c == '\\' {
					break
				}
				i++ // the contents of a valid string hold no quote and no control byte
				continue
			}
			r, size := utf8.DecodeRune(raw[i:])
			if (r == utf8.RuneError && size == 1) || r == '\u2028' || r == '\u2029' {
				break
			}
			i += size
		}
		w.write(raw[start:i])
		if i < len(raw) {
			var r rune
			r, i = decodeRune(raw, i)
			quoteRune(w, r)
		}
	}
	w.byte('"')
}

// quoteRune writes r as encoding/json writes it in a string.
func quoteRune(w *keyWriter, r rune) {
	const hex = "0123456789abcdef"
	switch r {
	case '"', '\\':
		w.byte('\\')
		w.byte(byte(r))
	case '\b':
		w.writeString(`\b`)
	case '\f':
		w.writeString(`\f`)
	case '\n':
		w.writeString(`\n`)
	case '\r':
		w.writeString(`\r`)
	case '\t':
		w.writeString(`\t`)
	case '\u2028', '\u2029':
		w.writeString(`\u202`)
		w.byte(hex[r&0xF])
	default:
		if r < 0x20 {
			w.writeString(`\u00`)
			w.byte(hex[r>>4])
			w.byte(hex[r&0xF])
			return
		}
		var buf [utf8.UTFMax]byte
		w.write(utf8.AppendRune(buf[:0], r))
	}
}

// number writes the number n as encoding/json encodes the float64 it decodes n into.
func number(w *keyWriter, n []byte) {
	if exactInt(n) {
		w.write(n) // the float64 of an integer of at most 15 digits is written as the integer
		return
	}
	f, _ := strconv.ParseFloat(string(n), 64)
	var buf [40]byte
	b := buf[:0]
	format := byte('f')
	if abs := math.Abs(f); abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' {
		// Clean up e-09 to e-9, as encoding/json does.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	w.write(b)
}

// exactInt reports whether the JSON number n is an integer of at most 15 digits, which a float64
// holds exactly and strconv writes back as it is (-0 included).
func exactInt(n []byte) bool {
	digits := n
	if len(digits) > 0 && digits[0] == '-' {
		digits = digits[1:]
	}
	if len(digits) == 0 || len(digits) > 15 {
		return false
	}
	for _, c := range digits {
		if !isDigit(c) {
			return false
		}
	}
	return true
}

// canonicalJSON is the canonical form of the raw JSON value by way of encoding/json, for values
// too long for the positions a member holds; with hint, without its cache_control member.
func canonicalJSON(raw []byte, hint bool) []byte {
	var v any
	if json.Unmarshal(raw, &v) != nil || v == nil {
		return nil
	}
	if m, ok := v.(map[string]any); ok && hint {
		delete(m, hintKey)
	}
	var sb bytes.Buffer
	enc := json.NewEncoder(&sb)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil
	}
	return bytes.TrimSuffix(sb.Bytes(), []byte("\n"))
}
