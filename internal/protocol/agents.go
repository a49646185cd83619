package protocol

import (
	"slices"
	"strings"
	"unicode/utf8"
)

// agents.go reads the bodies of the agent protocols, the OpenAI Responses API (responses.go) and
// the Anthropic Messages API (messages.go), into the same Request as chat bodies, with the same
// lexer, and writes their history keys with the same one-pass writer (history.go): the bound of
// the key is found while the body is checked, and the key is written from positions in the body.
// This file holds what the two share: their tools, how the members of an item, a part or a block
// are read, and how a content is written as it is read (streaming).
//
// Both protocols' bodies are read as the servers that define them read JSON: a repeated key's
// last value is the field's value, at every level, replacing the earlier one whole, and null is
// the field's absence. (Chat bodies keep encoding/json's rules instead, see chat.go.) Every
// value is still checked, so a field of the wrong type is an error even where a later value
// replaces it. Ids (user, prompt_cache_key, metadata.user_id, ...) are read as chat reads them.
//
// The fields that shape a conversation are typed, and a value of another type is an *Error that
// names the field: the arrays, their elements, and an item's or a message's role and type. What
// a content part or a block holds is free-form, as chat's content is: a member of another type
// than the one the key writes adds nothing to it. Items, tools, parts and blocks may be written
// as canonical JSON (canonical.go), so their numbers must fit a float64, as in chat's free-form
// values.

// field is a top-level field the history key is written from: where its value is (0 when absent
// or null: no value starts a body), and the bound of the key it makes.
type field struct {
	pos int
	keyBound
	tools toolsRead // of a tools field
	conv  convRead  // of a conversation field
}

// historyField reads the value of a field the history key is written from, whose first byte
// must be one of types (a string's quote, an array's bracket), with read. It returns the field:
// this value replaces an earlier one, and null clears it.
func (s *scanner) historyField(name, types string, read func(*scanner)) field {
	s.in(name)
	defer s.out()
	switch c := s.peek(); {
	case c == 'n':
		s.null()
		return field{}
	case strings.IndexByte(types, c) < 0:
		s.mismatch()
		return field{}
	}
	f := field{pos: s.pos}
	s.hist = keyBound{}
	read(s)
	f.keyBound = s.hist
	return f
}

// toolsField reads a tools field of the API kind (responsesToolsKind or messagesToolsKind), whose
// tools are of the shape ts, through the tools memo.
func (s *scanner) toolsField(kind byte, ts *toolSchema) field {
	var tools toolsRead
	f := s.historyField("tools", "[", func(s *scanner) {
		_, tools = s.toolsArray(kind, func(s *scanner) int {
			return s.array(func(s *scanner) { s.tool(ts) })
		})
	})
	f.tools = tools
	return f
}

// agentKey writes the history key of a Responses or Messages body raw with write, from its tools
// and the other fields its key is written from (see historyWriter.writeKey).
func agentKey(raw []byte, room keyRoom, write func(*historyWriter), tools field, fields ...field) (key string, onePass bool) {
	bound := keyBound{size: tools.size, named: tools.named}
	members := tools.members
	for _, f := range fields {
		bound.size += f.size
		members = max(members, f.members)
	}
	h := newHistoryWriter(valid(raw), members)
	return h.writeKey(bound, room, func() { write(&h) })
}

// kind is what an item, a content part or a block is, by its type: what the key writes of it.
type kind uint8

const (
	kindWhole     kind = iota // anything else: written whole, as canonical JSON
	kindNone                  // an image or a document: nothing
	kindMessage               // a message: its role and content
	kindText                  // a text part or block: its text
	kindRefusal               // a refusal part: its refusal
	kindCall                  // a function call or tool use
	kindOutput                // a function call's output or a tool result
	kindReasoning             // a reasoning item: its summary, content and encrypted content
	kindThinking              // a thinking block: its thinking
	kindRedacted              // a redacted thinking block: its data
)

// typeName reads the string at s.pos and returns its value when it is at most len(buf) bytes
// long, else as written: a value that long names no kind.
func (s *scanner) typeName(buf []byte) []byte {
	raw, escaped, high := s.str()
	return jstr{raw: raw, plain: !escaped && (!high || utf8.Valid(raw))}.name(buf)
}

// kindField reads a field typed as a string that says what its object is, and returns its value
// as typeName does: empty for null, which makes it absent. Another type is a type error.
func (s *scanner) kindField(name string, buf []byte) []byte {
	var v []byte
	s.in(name)
	switch s.peek() {
	case '"':
		v = s.typeName(buf)
	case 'n':
		s.null()
	default:
		s.mismatch()
	}
	s.out()
	return v
}

// textSize reads a free-form value the key writes as a field behind a tag when it is a non-empty
// string, and returns the most bytes that takes.
func (s *scanner) textSize() int {
	if s.peek() != '"' {
		s.skip(true)
		return 0
	}
	raw, n := s.strBound()
	if len(raw) == 0 {
		return 0
	}
	return 1 + fieldSize(n)
}

// stringSize reads a free-form value the key writes as a field when it is a string, and returns
// the most bytes that takes beyond the end of an empty field.
func (s *scanner) stringSize() int {
	if s.peek() != '"' {
		s.skip(true)
		return 0
	}
	_, n := s.strBound()
	return fieldSize(n)
}

// typedStringSize reads a field typed as a string (see stringField) that the key writes as a
// field, and returns the most bytes that takes beyond the end of an empty field.
func (s *scanner) typedStringSize(name string) int {
	if _, n, ok := s.stringField(name); ok {
		return fieldSize(n)
	}
	return 0
}

// canonicalSize reads a free-form value the key writes in canonical form as a field (or, a string
// of arguments, as the string it is), and returns the most bytes that takes: none for null.
func (s *scanner) canonicalSize() int {
	at := s.counts()
	s.skip(true)
	if string(s.data[at.pos:s.pos]) == "null" {
		return 0
	}
	return s.canonicalBound(at)
}

// counts is where the scanner is and what it has counted there (see scanner.grow).
type counts struct{ pos, grow, floats, keys int }

func (s *scanner) counts() counts { return counts{s.pos, s.grow, s.floats, s.keys} }

// canonicalBound is the most bytes the canonical form of the value read from at takes behind as a
// field. The canonicalizer's records must hold as many members as the value has.
func (s *scanner) canonicalBound(at counts) int {
	s.hist.members = max(s.hist.members, s.keys-at.keys)
	return fieldSize(s.pos - at.pos + s.grow - at.grow + maxFloatLen*(s.floats-at.floats))
}

// str reads the value at val into *dst when it is a string, else the empty string (null, or
// another type in a free-form value), and returns the position after it. The string is read once:
// it is written from *dst, without being looked for again.
func (h *historyWriter) str(val int, dst *jstr) int {
	if h.v[val] != '"' {
		*dst = jstr{plain: true}
		return h.v.skip(val)
	}
	var end int
	*dst, end = h.v.str(val)
	return end
}

// at reads where the value at val is into *dst, 0 for null, and returns the position after it.
func (h *historyWriter) at(val int, dst *int) int {
	*dst = val
	if h.v[val] == 'n' {
		*dst = 0
	}
	return h.v.skip(val)
}

// textValue is a free-form value that holds text (a content, an output): where it is (0 when
// absent or null), and the string it is, when it is one, read once.
type textValue struct {
	pos int
	s   jstr
}

// textValue reads the value at val into *dst and returns the position after it.
func (h *historyWriter) textValue(val int, dst *textValue) int {
	if h.v[val] == '"' {
		dst.pos = val
		return h.str(val, &dst.s)
	}
	dst.s = jstr{}
	return h.at(val, &dst.pos)
}

// fieldWhole writes the canonical JSON of the object at pos, an item, a block or a tool, without its
// cache_control member, as a field.
func (h *historyWriter) fieldWhole(pos int) {
	h.c.hint = true
	h.fieldCanonical(pos)
	h.c.hint = false
}

// toolSchema is how a protocol shapes its tools. A tool whose type is absent or the protocol's
// function type (function, custom) is written as chat writes a tool: "T" name· description·
// schema· (the schema as canonical JSON; x· is the field x, see historyKey). A tool of any other
// type (web_search, mcp, a server tool) is written whole, as "W" json· (its canonical JSON
// without cache_control). Both are sorted by name, as chat's are, the name of a tool of another
// type being its "name" member; tools without a name come first, in order.
type toolSchema struct {
	function string // the type of the tools written by name
	schema   string // the member that holds such a tool's schema
	// nested says that a function tool may be given in chat's shape: its name, description and
	// schema are then those of its "function" object.
	nested bool
}

var (
	responsesTools = toolSchema{function: "function", schema: "parameters", nested: true}
	messagesTools  = toolSchema{function: "custom", schema: "input_schema"}
)

// tool reads one element of tools, of the protocol whose tools ts describes.
func (s *scanner) tool(ts *toolSchema) {
	if !s.objectElement() {
		return
	}
	at := s.counts()
	size := len("T") + 3*fieldSize(0) // a tool written by name, with no name, description or schema
	function, named := true, false
	var buf [nameLen]byte
	// fn reads a member of a function tool, given flat or in a "function" object.
	fn := func(s *scanner, key []byte) bool {
		switch string(key) {
		case "name":
			if raw, n, ok := s.stringField("name"); ok {
				size += fieldSize(n)
				named = named || len(raw) > 0
			}
		case "description":
			size += s.typedStringSize("description")
		case ts.schema:
			s.in(ts.schema)
			size += s.canonicalSize()
			s.out()
		default:
			return false
		}
		return true
	}
	s.object(func(s *scanner, key []byte) {
		switch {
		case fn(s, key):
		case string(key) == "type":
			typ := s.kindField("type", buf[:])
			function = len(typ) == 0 || string(typ) == ts.function
		case string(key) == "function" && ts.nested:
			s.in("function")
			s.structValue(func(s *scanner, key []byte) {
				if !fn(s, key) {
					s.skip(true)
				}
			})
			s.out()
		default:
			s.skip(true)
		}
	})
	if function {
		s.hist.size += size
	} else {
		s.hist.size += len("W") + s.canonicalBound(at)
	}
	if named {
		s.hist.named++
	}
}

// agentTool is one element of tools as far as the key reads it: where its name is (0 when
// absent), and where the tool is when it is written whole, or else (whole 0) where its
// description and schema are.
type agentTool struct {
	name, description, schema, whole int
}

// agentTools writes the tools of the array at pos, sorted by name, keeping tools of the same name
// in order. Tools without a name come first, so they are written as they are read; only where
// the others' fields are is remembered, to be sorted.
func (h *historyWriter) agentTools(pos int, ts *toolSchema) {
	var named []agentTool
	if !h.w.counting() {
		named = make([]agentTool, 0, h.named)
	}
	h.named = 0
	h.elements(pos, func(e int) int {
		t, end := h.readAgentTool(e, ts)
		switch {
		case h.jstr(t.name).empty():
			h.writeAgentTool(&t)
		case h.w.counting():
			h.named++
			h.writeAgentTool(&t)
		default:
			named = append(named, t)
		}
		return end
	})
	slices.SortStableFunc(named, func(a, b agentTool) int {
		return compareJstr(h.jstr(a.name), h.jstr(b.name))
	})
	for i := range named {
		h.writeAgentTool(&named[i])
	}
}

// readAgentTool reads the tool at pos and returns it and the position after it. A function
// object (chat's shape) is read where it is.
func (h *historyWriter) readAgentTool(pos int, ts *toolSchema) (agentTool, int) {
	var flat, nested agentTool
	var typ jstr
	inFunction := false
	end := h.object(pos, func(key []byte, val int) int {
		if end, ok := h.toolField(&flat, ts, key, val); ok {
			return end
		}
		switch {
		case string(key) == "type":
			return h.str(val, &typ)
		case string(key) == "function" && ts.nested:
			nested, inFunction = agentTool{}, h.v[val] == '{'
			return h.object(val, func(key []byte, val int) int {
				if end, ok := h.toolField(&nested, ts, key, val); ok {
					return end
				}
				return h.v.skip(val)
			})
		}
		return h.v.skip(val)
	})
	var buf [nameLen]byte
	switch {
	case !typ.empty() && string(typ.name(buf[:])) != ts.function:
		return agentTool{name: flat.name, whole: pos}, end
	case inFunction:
		return nested, end
	}
	return flat, end
}

// toolField reads the member key of a function tool into t, if it is one of its fields, and
// returns the position after it and true.
func (h *historyWriter) toolField(t *agentTool, ts *toolSchema, key []byte, val int) (int, bool) {
	var dst *int
	switch string(key) {
	case "name":
		dst = &t.name
	case "description":
		dst = &t.description
	case ts.schema:
		dst = &t.schema
	default:
		return 0, false
	}
	end := h.at(val, dst)
	if dst != &t.schema && h.v[val] != '"' {
		*dst = 0
	}
	return end, true
}

func (h *historyWriter) writeAgentTool(t *agentTool) {
	h.w.text = true
	if t.whole != 0 {
		h.w.byte('W')
		h.fieldWhole(t.whole)
		return
	}
	h.w.byte('T')
	h.w.field(h.jstr(t.name))
	h.w.field(h.jstr(t.description))
	h.fieldCanonical(t.schema)
}

// elements calls each with the position of every object in the array at pos, which returns the
// position after it; other elements are passed over. It returns the position after the array.
func (h *historyWriter) elements(pos int, each func(int) int) int {
	e, more := h.v.first(pos)
	for more {
		var end int
		if h.v[e] == '{' {
			end = each(e)
		} else {
			end = h.v.skip(e)
		}
		e, more = h.v.next(end)
	}
	return e
}

// streaming is a content array written as it is read, as part of an object whose members are
// still being read: a later member may change what comes before it in the key, or replace it.
// The writer then takes back what it wrote, and writes the object once it is read whole, reading
// the content again. Clients send what comes first in the key first, so that is rare, and the
// content, most of a conversation's text, is read once.
type streaming struct {
	at mark
	on bool
}

func (st *streaming) start(w *keyWriter) { st.at, st.on = w.mark(), true }

// undo takes back what was written since start.
func (st *streaming) undo(w *keyWriter) {
	if st.on {
		w.reset(st.at)
		st.on = false
	}
}

// streamed reads the content at val, a member of an object whose array content st streams, into
// t, and returns the position after it. What an earlier content wrote as it was read is taken
// back; then, when stream holds and the content is an array, head is written and the array after
// it as it is read, by read (which returns the position after the array).
func (h *historyWriter) streamed(st *streaming, t *textValue, val int, stream bool, head func(), read func(int) int) int {
	st.undo(&h.w)
	if stream && h.v[val] == '[' {
		st.start(&h.w)
		head()
		*t = textValue{pos: val}
		return read(val)
	}
	return h.textValue(val, t)
}

// A Responses or Messages body is asked of /tokenize as the chat vLLM converts it to: vLLM serves
// both APIs by converting them to a chat completion request (its Responses serving builds chat
// messages from the instructions and input items; its Messages serving builds a
// ChatCompletionRequest from the system, messages and tools) and rendering that through the
// model's chat template. Asked with that chat's messages and tools, the engine answers with the
// prompt tokens it will cache for the request.
//
// The conversion follows vLLM's exactly where it can, and refuses (renders no query) where it
// cannot, so that a request is never matched against the engines' caches by tokens it will not
// have: images, documents and files (whose tokens the engine computes from the media), thinking
// blocks and reasoning items (passed to templates that may or may not render them), server and
// built-in tools, system messages among a Messages request's messages (which vLLM places by a
// per-model probe), a partial assistant message to continue, chat_template_kwargs, and any type
// the conversion does not know. It reads the body as the servers that define the APIs read JSON:
// keys match exactly, a repeated key's last value counts, and null is absence.

// chat is the chat a Responses or Messages body converts to, being built: its messages and tools
// are written as JSON into out, which the messages point into.
type chat struct {
	q     *query
	msgs  []chatMessage
	calls []toolCall
	tools []byte // the JSON of each tool, in order, each after a comma
	out   []byte // the JSON of contents, ids and arguments
	parts []jstr // scratch: the texts of a content being converted
	text  []byte // scratch: a text joined from parts
}

// chatMessage is one chat message: role, and the JSON of its content (none when empty) and of its
// tool_call_id (none when empty), in c.out; its tool calls are c.calls[callsFrom:callsTo].
type chatMessage struct {
	role               string
	content, callID    span
	callsFrom, callsTo int
}

// toolCall is a function call of an assistant message: the JSON of its id, name and arguments.
type toolCall struct{ id, name, args span }

// span is where a piece of JSON is in c.out.
type span struct{ from, to int }

func (c *chat) json(from int) span { return span{from, len(c.out)} }

// add appends a message of role with the content written at content (an empty span: none).
func (c *chat) add(role string, content span) *chatMessage {
	c.msgs = append(c.msgs, chatMessage{role: role, content: content, callsFrom: len(c.calls), callsTo: len(c.calls)})
	return &c.msgs[len(c.msgs)-1]
}

// text writes the string j as JSON.
func (c *chat) jstr(j jstr) span {
	from := len(c.out)
	c.out = c.q.appendJstr(c.out, j)
	return c.json(from)
}

// joined writes the texts of c.parts, one after the other, as one JSON string.
func (c *chat) joined() span {
	c.text = c.text[:0]
	for _, p := range c.parts {
		c.text = p.appendTo(c.text)
	}
	from := len(c.out)
	c.out = appendString(c.out, c.text)
	return c.json(from)
}

// textParts writes the texts of c.parts as an array of chat text parts.
func (c *chat) textParts() span {
	from := len(c.out)
	c.out = append(c.out, '[')
	for i, p := range c.parts {
		if i > 0 {
			c.out = append(c.out, ',')
		}
		c.out = append(c.out, `{"type":"text","text":`...)
		c.out = c.q.appendJstr(c.out, p)
		c.out = append(c.out, '}')
	}
	c.out = append(c.out, ']')
	return c.json(from)
}

// call adds a tool call to the last message, an assistant message.
func (c *chat) call(id, name, args span) {
	c.calls = append(c.calls, toolCall{id, name, args})
	c.msgs[len(c.msgs)-1].callsTo = len(c.calls)
}

// write writes the chat's messages (null when there are none) and its tools (left out when there
// are none) into the query, with add_generation_prompt.
func (c *chat) write() bool {
	q := c.q
	q.out = append(q.out, `,"messages":`...)
	if len(c.msgs) == 0 {
		q.out = append(q.out, "null"...)
	}
	for i, m := range c.msgs {
		q.out = append(q.out, "[,"[min(i, 1)])
		q.out = append(q.out, `{"role":`...)
		q.out = appendString(q.out, m.role)
		if m.content.to > m.content.from {
			q.out = append(append(q.out, `,"content":`...), c.out[m.content.from:m.content.to]...)
		}
		for k, tc := range c.calls[m.callsFrom:m.callsTo] {
			if k == 0 {
				q.out = append(q.out, `,"tool_calls":[`...)
			} else {
				q.out = append(q.out, ',')
			}
			q.out = append(append(q.out, `{"id":`...), c.out[tc.id.from:tc.id.to]...)
			q.out = append(append(q.out, `,"type":"function","function":{"name":`...), c.out[tc.name.from:tc.name.to]...)
			q.out = append(append(q.out, `,"arguments":`...), c.out[tc.args.from:tc.args.to]...)
			q.out = append(q.out, "}}"...)
		}
		if m.callsTo > m.callsFrom {
			q.out = append(q.out, ']')
		}
		if m.callID.to > m.callID.from {
			q.out = append(append(q.out, `,"tool_call_id":`...), c.out[m.callID.from:m.callID.to]...)
		}
		q.out = append(q.out, '}')
		if i == len(c.msgs)-1 {
			q.out = append(q.out, ']')
		}
	}
	if len(c.tools) > 0 {
		q.out = append(append(append(q.out, `,"tools":[`...), c.tools[1:]...), ']')
	}
	q.out = append(q.out, `,"add_generation_prompt":true`...)
	return true
}

// members reads the members named names of the object at pos into at: where the last value of
// each is, 0 when it is absent or null. ok is false when pos holds no object.
func (q *query) members(pos int, names []string, at []int) (ok bool) {
	if pos == 0 || q.v[pos] != '{' {
		return false
	}
	clear(at)
	var buf [nameLen]byte
	i, more := q.v.first(pos)
	for more {
		key, val := q.v.member(i)
		if k := slices.Index(names, string(key.name(buf[:]))); k >= 0 && q.v[val] != 'n' {
			at[k] = val
		} else if k >= 0 {
			at[k] = 0
		}
		i, more = q.v.next(q.v.skip(val))
	}
	return true
}

// str reads the string-typed member at pos: the empty string when it is absent (0); ok is false
// when it holds another type.
func (q *query) str(pos int) (j jstr, ok bool) {
	switch {
	case pos == 0:
		return jstr{plain: true}, true
	case q.v[pos] == '"':
		j, _ = q.v.str(pos)
		return j, true
	}
	return jstr{}, false
}

// each calls f with the position of each element of the array-typed member at pos (none when it
// is absent), while f returns true; ok is false when pos holds another type or f returned false.
func (q *query) each(pos int, f func(e int) bool) (ok bool) {
	if pos == 0 {
		return true
	}
	if q.v[pos] != '[' {
		return false
	}
	e, more := q.v.first(pos)
	for more {
		if !f(e) {
			return false
		}
		e, more = q.v.next(q.v.skip(e))
	}
	return true
}

// texts calls each with the text of each part of the array at pos (none when it is absent), each
// an object whose type is one of types; ok is false when pos holds another type, or a part is of
// another type or shape.
func (c *chat) texts(pos int, each func(text jstr), types ...string) (ok bool) {
	q := c.q
	var p [2]int
	return q.each(pos, func(e int) bool {
		if !q.members(e, []string{"type", "text"}, p[:]) {
			return false
		}
		typ, ok := q.str(p[0])
		if !ok || oneOf(typ, types...) == "" {
			return false
		}
		text, ok := q.str(p[1])
		if ok {
			each(text)
		}
		return ok
	})
}

// present drops the nulls of the top-level values a conversion reads: null is absence.
func (q *query) present() {
	for i, pos := range q.at {
		if pos != 0 && q.v[pos] == 'n' {
			q.at[i] = 0
		}
	}
}

// convertTools converts the tools at pos, each of a type accept lets through, to chat function
// tools: its name, its description and its JSON schema (the member schema), which must be an
// object. A tool that names no function is refused.
func (c *chat) convertTools(pos int, schema string, accept func(typ jstr, t []int) bool) bool {
	q := c.q
	names := []string{"type", "name", "description", schema, "defer_loading"}
	var t [5]int
	return q.each(pos, func(e int) bool {
		if !q.members(e, names, t[:]) {
			return false
		}
		typ, ok := q.str(t[0])
		if !ok || !accept(typ, t[:]) {
			return false
		}
		name, ok := q.str(t[1])
		if !ok || name.empty() {
			return false
		}
		c.tools = append(c.tools, `,{"type":"function","function":{"name":`...)
		c.tools = q.appendJstr(c.tools, name)
		if t[2] != 0 {
			description, ok := q.str(t[2])
			if !ok {
				return false
			}
			c.tools = append(c.tools, `,"description":`...)
			c.tools = q.appendJstr(c.tools, description)
		}
		if params := t[3]; params != 0 {
			if q.v[params] != '{' {
				return false
			}
			c.tools = q.v.appendCompact(append(c.tools, `,"parameters":`...), params)
		}
		c.tools = append(c.tools, "}}"...)
		return true
	})
}

// noToolsWhenNone refuses tools with tool_choice "none": vLLM can be started to leave the tools
// out of the prompt then (--exclude-tools-when-tool-choice-none), which a router cannot see.
func (c *chat) noToolsWhenNone(none bool) bool { return !(none && len(c.tools) > 0) }

// oneOf returns the name among names that j is.
func oneOf(j jstr, names ...string) string {
	for _, n := range names {
		if j.is(n) {
			return n
		}
	}
	return ""
}
