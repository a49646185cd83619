package protocol

import (
	"encoding/json"
	"slices"

	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// chat.go reads the body of the OpenAI chat API (POST /v1/chat/completions) as vLLM serves it,
// and writes its history key. The same reader reads completion and generate bodies
// (completions.go): which fields it reads, of which JSON types, and what each value does to what
// was read before. It reads the body through the lexer (lexer.go) in one pass that checks all of
// it. Of a chat's messages and tools it keeps only where their arrays are, and a bound on the size
// of the key they make: the history key reads them again from the body, in one pass into a
// buffer of that size, so that a body of many small parts costs no memory per part.
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

// ChatPath is the chat API's endpoint.
const ChatPath = "/v1/chat/completions"

// ChatTool is a function tool as the chat API spells it: the shape the Responses and Messages APIs'
// tools are converted to, for /tokenize here and for the chat template in the simulator.
type ChatTool struct {
	Type     string       `json:"type"` // "function"
	Function ChatFunction `json:"function"`
}

// ChatFunction is a function tool's definition, as vLLM's FunctionDefinition keeps it.
type ChatFunction struct {
	Name        string          `json:"name"`
	Description *string         `json:"description,omitempty"` // nil: absent, as vLLM tells it from ""
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// ParseChat reads a chat body (POST /v1/chat/completions) and the request's headers. A body that
// is not a JSON object, or whose routing fields have the wrong JSON type, is an *Error. Object
// keys are matched exactly, as vLLM does. Its /tokenize query is its messages and tools as sent.
func ParseChat(h reqkey.Header, raw []byte) (*Request, error) { return parseBody(h, raw, chatQuery) }

// parseBody reads a chat, completion or generate body, whose /tokenize query is render.
func parseBody(h reqkey.Header, raw []byte, render rendering) (*Request, error) {
	var b body
	if err := parseObject(raw, b.member); err != nil {
		return nil, err
	}
	r := &Request{Model: string(b.model), Stream: b.stream, Chat: b.messages != nil, MaxTokens: max(b.maxTokens, b.maxCompletionTokens),
		query: render}
	if r.Chat {
		r.Text = historyKey(b.tools, b.messages, roomFor(h, raw))
	} else {
		r.Text = routingText(&b, roomFor(h, raw))
	}
	paramsID, sessionID, userID, user := string(b.paramsID), string(b.sessionID), string(b.userID), string(b.user)
	r.SessionKey = reqkey.SessionKey(h, paramsID, []string{sessionID}, []string{userID, user})
	r.HashKey = reqkey.HashKey(h, []string{paramsID, user, sessionID, userID}, r.Text)
	return r, nil
}

// renderChat writes a chat's messages and tools as sent (messages null when absent, tools left
// out when absent), asking for the prompt of the assistant's reply.
func renderChat(q *query) bool {
	q.find("messages", "tools")
	q.member(`,"messages":`, q.at[0])
	if tools := q.at[1]; tools != 0 {
		q.member(`,"tools":`, tools)
	}
	q.out = append(q.out, `,"add_generation_prompt":true`...)
	return true
}

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

// member reads one top-level member whose key has been read.
func (b *body) member(s *scanner, key []byte) {
	switch string(key) {
	case "model":
		s.nullableString("model", &b.model)
	case "stream":
		b.stream = s.boolean("stream", false)
	case "messages":
		b.messages = s.arrayField("messages", b.messages, checkMessage, chatMessagesKind)
	case "tools":
		b.tools = s.arrayField("tools", b.tools, checkTool, chatToolsKind)
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

// arrays is a field whose value is an array of objects (messages, tools) given once or more:
// where the first non-empty array given since the field was last cleared (by null or by an empty
// array) is, and how many were given since. Element i of the field is element i of each of them,
// each decoded over what the earlier ones left (see valid.fold), as encoding/json decodes a
// repeated key into the same Go slice. Only positions are kept: the history key reads the
// elements again from the body, finding the later arrays by their key.
type arrays struct {
	data     []byte
	name     string    // the field's key
	first    int       // the position of the first array
	n        int       // how many arrays
	keyBound           // of the elements of all of them
	tools    toolsRead // of the one array of tools, when n is 1
	conv     convRead  // of the one array of messages, when n is 1
}

// arrayField reads an array of objects given for the field a, whose elements check reads, and
// returns what the field is then. The first array goes through the memo of its memoKind: the
// tools memo, or the conversation memo for chatMessagesKind (0: none).
func (s *scanner) arrayField(name string, a *arrays, check func(*scanner), memoKind byte) *arrays {
	s.in(name)
	switch s.peek() {
	case '[':
		start := s.pos
		s.hist = keyBound{inOrder: true}
		if a != nil && a.n > 0 {
			memoKind = 0
		}
		var n int
		var tools toolsRead
		var conv convRead
		if memoKind == chatMessagesKind {
			n, conv = s.conversation(memoKind, check)
		} else {
			n, tools = s.toolsArray(memoKind, func(s *scanner) int { return s.array(check) })
		}
		if a == nil {
			a = &arrays{data: s.data, name: name}
		}
		switch {
		case n == 0:
			a.n, a.keyBound = 0, keyBound{} // an empty array decodes into a new, empty slice
		case a.n == 0:
			a.first, a.n = start, 1
			a.keyBound, a.tools, a.conv = s.hist, tools, conv
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
		s.hist.size += s.textSize()
	case '[':
		s.array(func(s *scanner) {
			switch s.peek() {
			case '"':
				s.hist.size += s.textSize()
			case '{':
				s.object(func(s *scanner, key []byte) {
					if string(key) == "text" && s.peek() == '"' {
						s.hist.size += s.textSize()
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

// canonical reads a free-form value the key writes in canonical form as a field (or, a tool
// call's arguments, as the string it is).
func (s *scanner) canonical(name string) {
	s.in(name)
	s.hist.size += s.canonicalSize()
	s.out()
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

// historyKey is the history key of a chat (see history.go for the framing all keys share): tool
// schemas first, sorted by function name, so they are stable across turns; then each message in
// order. Below, x· is the field x: its bytes, then 0xFF.
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
func historyKey(tools, messages *arrays, room keyRoom) string {
	key, _ := writeHistoryKey(tools, messages, room)
	return key
}

// writeHistoryKey is historyKey, and reports whether the key was written in one pass.
func writeHistoryKey(tools, messages *arrays, room keyRoom) (key string, onePass bool) {
	if messages == nil {
		return "", false
	}
	h := newHistoryWriter(valid(messages.data), max(messages.members, tools.bound().members))
	h.inOrder = messages.inOrder
	bound := keyBound{size: messages.size + tools.bound().size, named: tools.bound().named}
	return h.writeKey(bound, room, func() { h.write(tools, messages) })
}

// bound is the key bound of the elements of a, or none when a is absent.
func (a *arrays) bound() keyBound {
	if a == nil {
		return keyBound{}
	}
	return a.keyBound
}

func (h *historyWriter) write(tools, messages *arrays) {
	switch {
	case tools == nil || tools.n == 0:
	case tools.n == 1:
		h.toolsPart(tools.tools, func() {
			h.outer = h.positions(tools, h.outer)
			h.tools()
		})
	default:
		h.outer = h.positions(tools, h.outer)
		h.tools()
	}
	if messages.n > 0 {
		h.outer = h.positions(messages, h.outer)
		h.elems = scratch(h.elems, messages.n)
		h.messages(messages)
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
		case t.name == 0 || h.jstr(t.name).empty():
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

// messages writes each message of a in order.
func (h *historyWriter) messages(a *arrays) {
	var m message
	h.elems, h.callsN = h.elems[:0], 0
	read := func(pos int) int {
		h.elems = append(h.elems, pos)
		return h.readMessage(pos, &m)
	}
	emit := func() {
		h.writeMessage(&m)
		m = message{}
		h.elems, h.callsN = h.elems[:0], 0
	}
	if a.n == 1 {
		// One array: its elements in order, through the conversation memo.
		h.conversationPart(a.conv, func(pos int) int {
			end := read(pos)
			emit()
			return end
		})
		return
	}
	h.v.fold(h.outer, read, emit)
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
	if !m.name.empty() {
		h.w.byte('n')
		h.w.field(m.name)
	}
	if !m.toolCallID.empty() {
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
	if !isText || (!typ.empty() && !typ.is("text") && !typ.is("input_text")) {
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

// setString sets *dst to val when val is a string: null leaves a string field as it is.
func (h *historyWriter) setString(dst *int, val int) {
	if h.v[val] == '"' {
		*dst = val
	}
}
