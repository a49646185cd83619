package protocol

import "slices"

// historyKey serializes a chat conversation so that a conversation's key is a byte prefix of the
// key of any continuation of it (the same tools, messages appended). Tool schemas come first,
// sorted by function name, so they are stable across turns; then each message in order. Every
// free-text field is written as its bytes followed by the byte 0xFF (fieldEnd), behind a
// one-letter tag, and every message ends with ".". No text holds 0xFF (see fieldEnd), so the end
// of a field is never taken for text: moving text from one field or message to another always
// changes the key. A conversation with no text at all (only images, say) has an empty key: there
// is nothing a worker could have cached that we could match.
//
// A field's text comes right after its tag, with nothing before it that depends on the rest of
// it, so two conversations whose messages agree up to some byte of a text have keys that agree up
// to that byte too: a shared document at the start of a user message, a long preamble or a set of
// few-shot examples is a shared prefix of the keys, as it is of the prompts a worker caches. (A
// length before each text, as in "<len>:<bytes>", would part the keys at its digits.)
//
// The framing is kept small on purpose: the router's match ratio is matched bytes over key bytes,
// and bulky shared framing ("role: user, name: ...") would make unrelated short chats look alike.
// The common roles are one letter; other fields appear only when present. Below, x· is the field
// x: its bytes, then 0xFF.
//
//	tool    = "T" name· description· parameters·  (parameters as canonical JSON)
//	message = role { "n" name· | "i" tool_call_id· | "c" text part· | "f" name· arguments· } "."
//	role    = "s" | "d" | "u" | "a" | "t" | "r" other role·
//
// The key is written from positions in the body, in one pass over the parts it reads, into a
// buffer the size of the bound the schema reader found for it (see keyBound): the key never
// outgrows it. Nothing is kept per message, content part or tool call, so a body of many tiny
// parts costs no more memory than that bound; only tools are remembered (where their fields are),
// to be sorted.
//
// The bound is close to the key for any body whose key is mostly its text. Where it is more than
// limit bytes (parts whose key outgrows them, numbers whose canonical form may be longer), the key
// is written in two passes instead: the first counts its bytes, the second writes it into a
// buffer of exactly that size.
func historyKey(tools, messages *arrays, limit int) string {
	key, _ := writeHistoryKey(tools, messages, limit)
	return key
}

// writeHistoryKey is historyKey, and reports whether the key was written in one pass.
func writeHistoryKey(tools, messages *arrays, limit int) (key string, onePass bool) {
	if messages == nil {
		return "", false
	}
	h := newHistoryWriter(valid(messages.data), max(messages.members, tools.bound().members))
	h.inOrder = messages.inOrder
	bound := keyBound{size: messages.size + tools.bound().size, named: tools.bound().named}
	return h.writeKey(bound, limit, func() { h.write(tools, messages) })
}

// newHistoryWriter returns a writer of a history key read from the body v, whose canonical values
// have at most members object members. It counts the key until given a buffer.
func newHistoryWriter(v valid, members int) historyWriter {
	h := historyWriter{v: v}
	h.c.v = v
	if members > 0 {
		h.c.recs = make([]member, 0, members)
	}
	return h
}

// writeKey writes a key whose size and named tools are at most bound's, by calling write once
// or twice: in one pass into a buffer of the bound's size when that is within limit; otherwise a
// first pass counts the key's bytes and the second writes it into a buffer of exactly that size.
// write writes the whole key into h.w, or counts it when h.w has no buffer. A key without text is
// empty.
func (h *historyWriter) writeKey(bound keyBound, limit int, write func()) (key string, onePass bool) {
	size := bound.size
	if onePass = size <= limit; onePass {
		h.named = bound.named
	} else {
		write()
		if !h.w.text {
			return "", false
		}
		size = h.w.n
	}
	h.w = writerOf(size)
	write()
	if !h.w.text {
		return "", onePass
	}
	return h.w.string(), onePass
}

// bound is the key bound of the elements of a, or none when a is absent.
func (a *arrays) bound() keyBound {
	if a == nil {
		return keyBound{}
	}
	return a.keyBound
}

// historyWriter writes the history key of one chat, Responses or Messages body, or counts its
// bytes.
type historyWriter struct {
	v valid
	w keyWriter
	c canonicalizer
	// named is the most tools with a name: the writing pass sorts them. The counting pass counts
	// them exactly.
	named int
	// inOrder says that the messages array is given once and its messages are in order (see
	// keyBound). Each message's content is then written as it is read, rather than found first
	// and read again.
	inOrder bool
	// Scratch space, sized once: cursors over the messages or tools arrays, the positions of the
	// elements of the message being read, and cursors over its tool_calls arrays.
	outer, elems, inner []int
	// The tool_calls arrays of the message being read: the first given since the field was last
	// cleared is in its element callsElem (an index in elems), at callsPos; callsN were given.
	callsElem, callsPos, callsN int
	keyBuf                      [nameLen]byte
}

func (h *historyWriter) write(tools, messages *arrays) {
	if tools != nil && tools.n > 0 {
		h.outer = h.positions(tools, h.outer)
		h.tools()
	}
	if messages.n > 0 {
		h.outer = h.positions(messages, h.outer)
		h.elems = scratch(h.elems, messages.n)
		h.messages()
	}
}

// positions returns in dst the positions of the arrays given for a, found again by their key.
func (h *historyWriter) positions(a *arrays, dst []int) []int {
	dst = append(scratch(dst, a.n), a.first)
	if a.n == 1 {
		return dst
	}
	for pos, more := h.v.next(h.v.skip(a.first)); more && len(dst) < a.n; {
		key, val := h.v.member(pos)
		if string(key.name(h.keyBuf[:])) == a.name {
			dst = append(dst, val)
		}
		pos, more = h.v.next(h.v.skip(val))
	}
	return dst
}

// scratch returns s emptied, with room for n elements: grown to exactly n when it has less room,
// where growing it by appending would allocate several times that.
func scratch(s []int, n int) []int {
	if cap(s) < n {
		return make([]int, 0, n)
	}
	return s[:0]
}

// tool is one element of tools as far as the key reads it: where its function's name,
// description and parameters are (0 when absent), and its place among the named tools.
type tool struct {
	name, description, params int
	index                     int
}

// tools writes the tools sorted by name, keeping tools of the same name in order. Tools without
// a name come first, so they are written as they are read; only the others are remembered.
func (h *historyWriter) tools() {
	var named []tool
	if !h.w.counting() {
		named = make([]tool, 0, h.named)
	}
	h.named = 0
	var t tool
	h.v.fold(h.outer, func(pos int) int { return h.readTool(pos, &t) }, func() {
		h.w.text = true
		switch {
		case t.name == 0 || h.jstr(t.name).len() == 0:
			h.writeTool(&t)
		case h.w.counting():
			h.named++
			h.writeTool(&t)
		default:
			t.index = len(named)
			named = append(named, t)
		}
		t = tool{}
	})
	slices.SortFunc(named, func(a, b tool) int {
		if c := compareJstr(h.jstr(a.name), h.jstr(b.name)); c != 0 {
			return c
		}
		return a.index - b.index
	})
	for i := range named {
		h.writeTool(&named[i])
	}
}

// function reads the object at pos, a tool or a tool call, and hands each member of its
// "function" object to field; the other members are skipped. It returns the position after it.
func (h *historyWriter) function(pos int, field func(key []byte, val int) int) int {
	return h.object(pos, func(key []byte, val int) int {
		if string(key) != "function" {
			return h.v.skip(val)
		}
		return h.object(val, field)
	})
}

// readTool reads one element of tools over t and returns the position after it.
func (h *historyWriter) readTool(pos int, t *tool) int {
	return h.function(pos, func(key []byte, val int) int {
		switch string(key) {
		case "name":
			h.setString(&t.name, val)
		case "description":
			h.setString(&t.description, val)
		case "parameters":
			t.params = val
		}
		return h.v.skip(val)
	})
}

func (h *historyWriter) writeTool(t *tool) {
	h.w.byte('T')
	h.fieldString(t.name)
	h.fieldString(t.description)
	h.fieldCanonical(t.params)
}

// message is one element of messages as far as the key reads it. Where its tool_calls arrays are
// is kept in the historyWriter.
type message struct {
	role, name, toolCallID jstr
	content                int // where the content is (0 when absent), to be read after the rest
	// The counting pass measures the content as it reads it: its size and whether it has text.
	contentSize int
	contentText bool
	started     bool // its role, name and tool_call_id are written
}

// messages writes each message in order.
func (h *historyWriter) messages() {
	var m message
	h.elems, h.callsN = h.elems[:0], 0
	read := func(pos int) int {
		h.elems = append(h.elems, pos)
		return h.readMessage(pos, &m)
	}
	h.v.fold(h.outer, read, func() {
		h.writeMessage(&m)
		m = message{}
		h.elems, h.callsN = h.elems[:0], 0
	})
}

// readMessage reads one element of messages over m and returns the position after it.
func (h *historyWriter) readMessage(pos int, m *message) int {
	return h.object(pos, func(key []byte, val int) int {
		switch string(key) {
		case "role":
			return h.stringField(&m.role, val)
		case "name":
			return h.stringField(&m.name, val)
		case "tool_call_id":
			return h.stringField(&m.toolCallID, val)
		case "content":
			switch {
			case h.w.counting():
				size := keyWriter{}
				end := h.content(&size, val)
				m.contentSize, m.contentText = size.n, size.text
				return end
			case h.inOrder:
				h.start(m)
				return h.content(&h.w, val)
			}
			m.content = val
		case "tool_calls":
			if h.v[val] == 'n' {
				h.callsN = 0
				return val + len("null")
			}
			switch _, ok := h.v.first(val); {
			case !ok:
				h.callsN = 0 // an empty array decodes into a new, empty slice
			case h.callsN == 0:
				h.callsElem, h.callsPos, h.callsN = len(h.elems)-1, val, 1
			default:
				h.callsN++
			}
		}
		return h.v.skip(val)
	})
}

// start writes the role, name and tool_call_id of m, once: what comes before its content.
func (h *historyWriter) start(m *message) {
	if m.started {
		return
	}
	m.started = true
	h.role(m.role)
	if m.name.len() > 0 {
		h.w.byte('n')
		h.w.field(m.name)
	}
	if m.toolCallID.len() > 0 {
		h.w.byte('i')
		h.w.field(m.toolCallID)
	}
}

func (h *historyWriter) writeMessage(m *message) {
	h.start(m)
	switch {
	case h.w.counting():
		h.w.n += m.contentSize
		h.w.text = h.w.text || m.contentText
	case !h.inOrder && m.content != 0:
		h.content(&h.w, m.content)
	}
	h.toolCalls()
	h.w.byte('.')
}

// role writes the role of a message: one letter for the common roles.
func (h *historyWriter) role(role jstr) {
	switch string(role.name(h.keyBuf[:])) {
	case "system":
		h.w.byte('s')
	case "developer":
		h.w.byte('d')
	case "user":
		h.w.byte('u')
	case "assistant":
		h.w.byte('a')
	case "tool":
		h.w.byte('t')
	default:
		h.w.byte('r')
		h.w.field(role)
	}
}

// content writes to w the text of the message content at pos and returns the position after
// it: a string, or the strings and text parts of a content array. Image, audio and other parts
// contribute nothing.
func (h *historyWriter) content(w *keyWriter, pos int) int {
	switch h.v[pos] {
	case '"':
		j, end := h.v.str(pos)
		textPart(w, j)
		return end
	case '[':
		i, more := h.v.first(pos)
		for more {
			var end int
			switch h.v[i] {
			case '"':
				var j jstr
				j, end = h.v.str(i)
				textPart(w, j)
			case '{':
				var text jstr
				text, end = h.part(i)
				textPart(w, text)
			default:
				end = h.v.skip(i)
			}
			i, more = h.v.next(end)
		}
		return i
	}
	return h.v.skip(pos)
}

func textPart(w *keyWriter, j jstr) { tagged(w, 'c', j) }

// tagged writes the text j as a field behind tag, when it is not empty.
func tagged(w *keyWriter, tag byte, j jstr) {
	if j.len() > 0 {
		w.text = true
		w.byte(tag)
		w.field(j)
	}
}

// part reads the content part object at i and returns its text when it is a text part (the
// empty string otherwise), and the position after it. A text part has a string "text" and a
// "type" that is absent, not a string, empty, "text" or "input_text".
func (h *historyWriter) part(i int) (text jstr, end int) {
	var typ jstr
	isText := false
	pos, more := h.v.first(i)
	for more {
		key, val := h.v.member(pos)
		switch string(key.name(h.keyBuf[:])) {
		case "type":
			typ = jstr{}
			if h.v[val] == '"' {
				typ, end = h.v.str(val)
			} else {
				end = h.v.skip(val)
			}
		case "text":
			isText = h.v[val] == '"'
			if isText {
				text, end = h.v.str(val)
			} else {
				end = h.v.skip(val)
			}
		default:
			end = h.v.skip(val)
		}
		pos, more = h.v.next(end)
	}
	if !isText || (typ.len() > 0 && !typ.is("text") && !typ.is("input_text")) {
		return jstr{}, pos
	}
	return text, pos
}

// toolCalls writes the tool calls of the message being written.
func (h *historyWriter) toolCalls() {
	if h.callsN == 0 {
		return
	}
	// Find the later tool_calls arrays again by their key: in the rest of the element that holds
	// the first, then in the later elements.
	h.inner = append(scratch(h.inner, h.callsN), h.callsPos)
	pos, more := h.v.next(h.v.skip(h.callsPos))
	h.inner = h.appendCalls(h.inner, pos, more)
	for _, e := range h.elems[h.callsElem+1:] {
		if h.v[e] != 'n' {
			pos, more := h.v.first(e)
			h.inner = h.appendCalls(h.inner, pos, more)
		}
	}
	var name jstr
	var args int
	read := func(pos int) int {
		return h.function(pos, func(key []byte, val int) int {
			switch string(key) {
			case "name":
				return h.stringField(&name, val)
			case "arguments":
				args = val
			}
			return h.v.skip(val)
		})
	}
	h.v.fold(h.inner, read, func() {
		h.w.text = true
		h.w.byte('f')
		h.w.field(name)
		h.fieldArguments(args)
		name, args = jstr{}, 0
	})
}

// appendCalls appends to dst the positions of the tool_calls arrays among the object members from
// pos on, while there are more (and fewer than callsN in dst).
func (h *historyWriter) appendCalls(dst []int, pos int, more bool) []int {
	for more && len(dst) < h.callsN {
		key, val := h.v.member(pos)
		if string(key.name(h.keyBuf[:])) == "tool_calls" {
			dst = append(dst, val)
		}
		pos, more = h.v.next(h.v.skip(val))
	}
	return dst
}

// object calls member with the key and the value's position of each member of the object at i,
// and returns the position after the object. member returns the position after the value. null
// leaves what the object would be decoded into as it is: it has no members.
func (h *historyWriter) object(i int, member func(key []byte, val int) int) int {
	if h.v[i] == 'n' {
		return i + len("null")
	}
	pos, more := h.v.first(i)
	for more {
		key, val := h.v.member(pos)
		pos, more = h.v.next(member(key.name(h.keyBuf[:]), val))
	}
	return pos
}

// stringField reads the string-typed field at val into *dst and returns the position after it:
// null leaves the field as it is.
func (h *historyWriter) stringField(dst *jstr, val int) int {
	if h.v[val] != '"' {
		return val + len("null")
	}
	var end int
	*dst, end = h.v.str(val)
	return end
}

// setString sets *dst to val when val is a string: null leaves a string field as it is.
func (h *historyWriter) setString(dst *int, val int) {
	if h.v[val] == '"' {
		*dst = val
	}
}

// jstr is the string at pos, or the empty string when pos is 0 or holds another value.
func (h *historyWriter) jstr(pos int) jstr {
	if pos == 0 || h.v[pos] != '"' {
		return jstr{plain: true}
	}
	j, _ := h.v.str(pos)
	return j
}

// fieldString writes the string at pos (0: the empty string) as a field.
func (h *historyWriter) fieldString(pos int) {
	h.w.field(h.jstr(pos))
}

// fieldArguments writes a tool call's arguments as a field: the string as sent (OpenAI sends a
// JSON string), or the canonical JSON of an object some clients send instead.
func (h *historyWriter) fieldArguments(pos int) {
	if pos != 0 && h.v[pos] == '"' {
		h.fieldString(pos)
		return
	}
	h.fieldCanonical(pos)
}

// fieldCanonical writes the canonical JSON of the value at pos (nothing for 0 or null) as a
// field.
func (h *historyWriter) fieldCanonical(pos int) {
	if pos != 0 {
		h.c.write(&h.w, pos)
	}
	h.w.byte(fieldEnd)
}
