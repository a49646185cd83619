package protocol

import (
	"slices"
	"unicode/utf8"
)

// tokenize.go renders what an engine's POST /tokenize is asked for a request so that it answers
// with the prompt tokens it will compute for the request: vLLM's tokenize API takes a chat's
// messages and tools (with add_generation_prompt) or a completion's prompt. Each protocol renders
// its own (chat.go, completions.go, responses.go, messages.go). Nothing is parsed again: the
// values are read from the body the lexer checked, found by the reader of checked documents
// (validated.go), as the history key is written; and only when the query is asked for, so that a
// parse costs nothing more for it.
//
// The query is written as encoding/json writes it without HTML escaping, so that a text holding
// "<" reaches the engine as it was sent, and an engine that renders the tools as sent (the
// simulator) sees them as the client wrote them.

// rendering names the /tokenize query of a protocol, which renderings[r] writes.
type rendering uint8

const (
	notTokenized rendering = iota
	chatQuery
	completionQuery
	responsesQuery
	messagesQuery
)

var renderings = [...]func(*query) bool{
	chatQuery:       renderChat,
	completionQuery: renderCompletion,
	responsesQuery:  renderResponses,
	messagesQuery:   renderMessages,
}

// query is a /tokenize query being written: the body it is read from, where the top-level values
// it reads are (see find), and what is written so far.
type query struct {
	v   valid
	at  [8]int
	out []byte
	buf []byte // scratch space for decoded strings
}

// AppendTokenizeBody appends to dst the body of a POST /tokenize that asks model for the prompt
// tokens of the request read from body, as the engine will render them: a chat's messages and
// tools, a Responses or Messages body as the chat vLLM converts it to, or a completion's prompt.
// ok is false when the request is not tokenized (see Tokenizes), or when its body would not be
// rendered exactly (a Responses or Messages body vLLM renders from what the router cannot see).
// body must be the bytes the request was parsed from. dst may be a buffer kept between queries:
// the query is about as long as body.
func (r *Request) AppendTokenizeBody(dst, body []byte, model string) (ask []byte, ok bool) {
	if r.query == notTokenized {
		return nil, false
	}
	q := query{v: valid(body), out: slices.Grow(dst, len(body)+len(model)+64)}
	q.out = append(q.out, `{"model":`...)
	q.out = appendString(q.out, model)
	if !renderings[r.query](&q) {
		return nil, false
	}
	return append(q.out, "}\n"...), true
}

// Tokenizes reports whether the request's protocol renders a /tokenize query for it (see
// AppendTokenizeBody): a chat, a completion, a Responses or a Messages request.
func (r *Request) Tokenizes() bool { return r.query != notTokenized }

// CacheSalt is the top-level cache_salt of body, the bytes the request was parsed from ("" without
// one); ok is false when a value given for it is neither a string nor null, which an engine
// refuses. vLLM folds the salt into a request's first block, so that requests of different salts
// never share cached blocks.
func (r *Request) CacheSalt(body []byte) (salt string, ok bool) {
	q := query{v: valid(body)}
	ok = true
	q.topLevel(func(key []byte, val int) {
		if string(key) != "cache_salt" {
			return
		}
		switch q.v[val] {
		case '"':
			j, _ := q.v.str(val)
			salt = string(j.appendTo(nil))
		case 'n':
			salt = ""
		default:
			ok = false
		}
	})
	if !ok {
		return "", false
	}
	return salt, true
}

// topLevel calls member with the key and the position of the value of each member of the body, a
// JSON object the lexer accepted.
func (q *query) topLevel(member func(key []byte, val int)) {
	var buf [nameLen]byte
	i, more := q.v.first(q.v.ws(0))
	for more {
		key, val := q.v.member(i)
		member(key.name(buf[:]), val)
		i, more = q.v.next(q.v.skip(val))
	}
}

// find sets q.at[i] to where the last value given for the top-level member names[i] is (0 when
// none is; a null is where it is).
func (q *query) find(names ...string) {
	q.topLevel(func(key []byte, val int) {
		if i := slices.Index(names, string(key)); i >= 0 {
			q.at[i] = val
		}
	})
}

// member writes the member name (a JSON string with its quotes and colon, after a comma) and the
// compact JSON of the value at pos, or null when pos is 0.
func (q *query) member(name string, pos int) {
	q.out = append(q.out, name...)
	if pos == 0 {
		q.out = append(q.out, "null"...)
		return
	}
	q.out = q.v.appendCompact(q.out, pos)
}

// appendCompact appends the value at i without the whitespace between its tokens, as
// encoding/json compacts a json.RawMessage.
func (v valid) appendCompact(dst []byte, i int) []byte {
	end := v.skip(i)
	for i < end {
		switch c := v[i]; c {
		case ' ', '\t', '\n', '\r':
			i++
		case '"':
			e := v.strEnd(i)
			dst = append(dst, v[i:e]...)
			i = e
		default:
			start := i
			for i < end && v[i] != '"' && v[i] > ' ' {
				i++
			}
			dst = append(dst, v[start:i]...)
		}
	}
	return dst
}

// appendJstr appends the value of the string j as JSON (see appendString).
func (q *query) appendJstr(dst []byte, j jstr) []byte {
	if j.plain {
		return appendString(dst, j.raw)
	}
	q.buf = j.appendTo(q.buf[:0])
	return appendString(dst, q.buf)
}

// appendString appends s as encoding/json writes a string without HTML escaping: quoted, with a
// quote, a backslash and control characters escaped, each byte of invalid UTF-8 written as
// \ufffd, and U+2028 and U+2029 escaped.
func appendString[S []byte | string](dst []byte, s S) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch c {
			case '"', '\\':
				dst = append(dst, '\\', c)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRune([]byte(s[i:min(len(s), i+utf8.UTFMax)]))
		switch {
		case r == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case r == '\u2028' || r == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[r&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}
