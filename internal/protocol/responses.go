package protocol

import (
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// responses.go reads an OpenAI Responses API body (see agents.go for the rules both agent
// protocols share) and writes its history key.

// ResponsesPath is the Responses API's endpoint; a stored response is at ResponsesPath/{id}.
const ResponsesPath = "/v1/responses"

// ParseResponses reads a Responses API body (POST /v1/responses): model, stream, store,
// previous_response_id, the session and hash keys, and the history key of its tools,
// instructions and input (see writeResponses). The body carries a conversation (Chat) when it
// has an input.
func ParseResponses(h reqkey.Header, raw []byte) (*Request, error) {
	var b responsesBody
	if err := parseObject(raw, b.member); err != nil {
		return nil, err
	}
	r := &Request{Model: string(b.model), Stream: b.stream, Chat: b.input.pos != 0, MaxTokens: b.maxTokens,
		PreviousResponseID: string(b.previousID), NoStore: b.noStore,
		query: responsesQuery}
	if r.Chat {
		r.Text, _ = b.key(raw, roomFor(h, raw))
	}
	conversation, cacheKey, user := string(b.conversation), string(b.cacheKey), string(b.user)
	r.SessionKey = reqkey.SessionKey(h, string(b.paramsID), []string{conversation, cacheKey}, []string{user})
	r.HashKey = reqkey.HashKey(h, []string{conversation, cacheKey, user}, r.Text)
	return r, nil
}

// responsesBody holds the top-level fields of a Responses body that routing reads. Byte slices
// may point into the request body.
type responsesBody struct {
	model, previousID   []byte
	stream, noStore     bool
	maxTokens           int // max_output_tokens, for the rate limits
	tools, instructions field
	input               field // a string or an array of items
	// paramsID is session_params.session_id; conversation is the conversation's id, given as a
	// string or as the "id" of an object.
	paramsID, conversation, cacheKey, user []byte
}

// member reads one top-level member whose key has been read.
func (b *responsesBody) member(s *scanner, key []byte) {
	switch string(key) {
	case "model":
		s.nullableString("model", &b.model)
	case "stream":
		b.stream = s.boolean("stream", false)
	case "store":
		b.noStore = !s.boolean("store", true)
	case "max_output_tokens":
		b.maxTokens = s.tokenCount()
	case "previous_response_id":
		s.nullableString("previous_response_id", &b.previousID)
	case "tools":
		b.tools = s.toolsField(responsesToolsKind, &responsesTools)
	case "instructions":
		b.instructions = s.historyField("instructions", `"`, checkInstructions)
	case "input":
		b.input = s.historyField("input", `"[`, checkInput)
	case "conversation":
		if s.peek() == '{' {
			s.idIn("id", &b.conversation)
		} else {
			s.id(&b.conversation)
		}
	case "prompt_cache_key":
		s.id(&b.cacheKey)
	case "user":
		s.id(&b.user)
	case "session_params":
		s.idIn("session_id", &b.paramsID)
	default:
		s.skip(false)
	}
}

func checkInstructions(s *scanner) {
	s.hist.size += len("s.") + s.textSize()
}

func checkInput(s *scanner) {
	if s.peek() == '"' {
		s.hist.size += len("u.") + s.textSize() // one user message
		return
	}
	s.array(checkItem)
}

// checkItem reads one element of input: an item, whose type says what the key writes of it (see
// itemKind). The bound of each kind is summed over the members it reads, repeated or not, and
// the item's bound is that of its kind, known once it is read whole.
func checkItem(s *scanner) {
	if !s.objectElement() {
		return
	}
	at := s.counts()
	var buf [nameLen]byte
	var typ []byte
	roles, roleless := 0, true // the last role may be absent (or null): "r" and an empty field are written
	var content, callID, name, args, output, summary, encrypted int
	hasID := false
	// What a message's content or an output written as it is read may take (see item): a later
	// type may make the item of another kind, but they were written first.
	var streamedContent, streamedOutput int
	s.object(func(s *scanner, key []byte) {
		switch string(key) {
		case "type":
			typ = s.kindField("type", buf[:])
		case "role":
			raw, n, ok := s.stringField("role")
			if ok {
				roles += roleSize(raw, n)
			}
			roleless = !ok
		case "call_id":
			hasID = s.peek() == '"'
			callID += s.typedStringSize("call_id")
		case "name":
			name += s.typedStringSize("name")
		case "arguments":
			s.in("arguments")
			args += s.canonicalSize()
			s.out()
		case "content":
			array := s.peek() == '['
			size := s.partsSize("content")
			content += size
			if array && !roleless && len(typ) > 0 && itemKind(typ) == kindMessage {
				streamedContent = max(streamedContent, roles+size)
			}
		case "output":
			array := s.peek() == '['
			size := s.partsSize("output")
			output += size
			if array && hasID && len(typ) > 0 && itemKind(typ) == kindOutput {
				streamedOutput = max(streamedOutput, len("o")+fieldSize(0)+callID+size)
			}
		case "summary":
			summary += s.partsSize("summary")
		case "encrypted_content":
			s.in("encrypted_content")
			encrypted += s.textSize()
			s.out()
		default:
			s.skip(true)
		}
	})
	switch k := itemKind(typ); k {
	case kindMessage:
		if roleless {
			roles += len("r") + fieldSize(0)
		}
		s.hist.size += roles + content + len(".") + streamedOutput
	case kindOutput:
		s.hist.size += len("o.") + fieldSize(0) + callID + output + streamedContent
	default:
		s.hist.size += streamedContent + streamedOutput
		switch k {
		case kindCall:
			s.hist.size += len("f.") + 3*fieldSize(0) + callID + name + args
		case kindReasoning:
			s.hist.size += len("z.") + summary + content + encrypted
		default:
			s.hist.size += len("J.") + s.canonicalBound(at)
		}
	}
}

// partsSize reads a free-form value of text parts (content, output, summary) and returns the most
// bytes the key takes of it: of a string, or of the text and refusal of each part of an array.
func (s *scanner) partsSize(name string) int {
	s.in(name)
	size := 0
	switch s.peek() {
	case '"':
		size = s.textSize()
	case '[':
		s.array(func(s *scanner) {
			if s.peek() != '{' {
				s.skip(true)
				return
			}
			s.object(func(s *scanner, key []byte) {
				switch string(key) {
				case "text", "refusal":
					size += s.textSize()
				default:
					s.skip(true)
				}
			})
		})
	default:
		s.skip(true)
	}
	s.out()
	return size
}

// itemKind is the kind of an input item of the type typ: a message when it has none.
func itemKind(typ []byte) kind {
	switch string(typ) {
	case "", "message":
		return kindMessage
	case "function_call":
		return kindCall
	case "function_call_output":
		return kindOutput
	case "reasoning":
		return kindReasoning
	}
	return kindWhole
}

// partKind is the kind of a content part of the type typ: text when it has none, as in chat.
func partKind(typ []byte) kind {
	switch string(typ) {
	case "", "text", "input_text", "output_text", "summary_text", "reasoning_text":
		return kindText
	case "refusal":
		return kindRefusal
	}
	return kindNone
}

// key writes the history key of the body raw; see writeResponses.
func (b *responsesBody) key(raw []byte, room keyRoom) (key string, onePass bool) {
	return agentKey(raw, room, func(h *historyWriter) { h.writeResponses(b) }, b.tools, b.instructions, b.input)
}

// writeResponses writes the history key of a Responses body, in chat's framing (see historyKey)
// extended to the input's items, so that the key of a conversation is a byte prefix of the key of
// any continuation of it: the same tools and instructions, items appended to its input. Tools
// come first (see toolSchema), then the instructions written as a system message, then each item
// in order; each item, like each of chat's messages, ends with ".".
//
//	key      = {tool} ["s" ["c" instructions·] "."] (user | {item})
//	user     = "u" ["c" input·] "."                          an input string: one user message
//	item     = role {"c" text· | "x" refusal·} "."          a message (type absent or message)
//	         | "f" call_id· name· arguments· "."             a function_call
//	         | "o" call_id· {"c" text· | "x" refusal·} "."   a function_call_output
//	         | "z" {"y" summary·} {"k" text·} ["e" encrypted_content·] "."   a reasoning item
//	         | "J" item· "."                                 an item of any other type, as canonical JSON
//	role     = "s" | "d" | "u" | "a" | "t" | "r" other role·  as chat's
//
// (x· is the field x: its bytes, then 0xFF; see historyKey.)
//
// A content (or output, or summary) is a string, one text part, or an array of parts: a part
// whose type is absent, text, input_text, output_text, summary_text or reasoning_text writes its
// text, a refusal part its refusal (but in a reasoning item, where "x" would not say whether it
// was the summary's or the content's), any other (input_image, input_file, ...) nothing, as
// chat's images write nothing. Arguments are written as chat writes a tool call's. A reasoning item's
// encrypted_content is written too: it is what the server decrypts into the prompt, and clients
// resend it unchanged, so it keeps the prefix property; the summary alone is not the prompt.
// An item's id and status are not written: they are no part of the prompt.
func (h *historyWriter) writeResponses(b *responsesBody) {
	if b.tools.pos != 0 {
		h.toolsPart(b.tools.tools, func() { h.agentTools(b.tools.pos, &responsesTools) })
	}
	if b.instructions.pos != 0 {
		h.w.byte('s')
		textPart(&h.w, h.jstr(b.instructions.pos))
		h.w.byte('.')
	}
	if h.v[b.input.pos] == '"' {
		h.w.byte('u')
		textPart(&h.w, h.jstr(b.input.pos))
		h.w.byte('.')
		return
	}
	h.elements(b.input.pos, h.item)
}

// item is an input item as far as the key reads it: its strings, and where its other values are
// (0 when absent).
type item struct {
	typ, role, callID, name, encrypted jstr
	content, output, summary           textValue
	args                               int
}

// item writes the input item at pos and returns the position after it. A message's content
// array after its type and role, and an output array after its type and call_id, are written as
// they are read (see streaming).
func (h *historyWriter) item(pos int) int {
	var it item
	var st streaming
	var buf [nameLen]byte
	hasRole, hasID := false, false
	// streams reports whether an array, the value of a member that the item's kind k writes
	// after what was read so far, can be written as it is read.
	streams := func(k kind, ready bool) bool {
		return ready && !it.typ.empty() && itemKind(it.typ.name(buf[:])) == k
	}
	messageParts := func(pos int) int { return h.partsOf('c', 'x', pos) }
	end := h.object(pos, func(key []byte, val int) int {
		switch string(key) {
		case "type":
			st.undo(&h.w)
			return h.str(val, &it.typ)
		case "role":
			st.undo(&h.w)
			hasRole = h.v[val] == '"'
			return h.str(val, &it.role)
		case "call_id":
			st.undo(&h.w)
			hasID = h.v[val] == '"'
			return h.str(val, &it.callID)
		case "content":
			return h.streamed(&st, &it.content, val, streams(kindMessage, hasRole), func() { h.role(it.role) }, messageParts)
		case "output":
			return h.streamed(&st, &it.output, val, streams(kindOutput, hasID), func() { h.w.byte('o'); h.w.field(it.callID) }, messageParts)
		case "name":
			return h.str(val, &it.name)
		case "encrypted_content":
			return h.str(val, &it.encrypted)
		case "arguments":
			return h.at(val, &it.args)
		case "summary":
			return h.textValue(val, &it.summary)
		}
		return h.v.skip(val)
	})
	switch itemKind(it.typ.name(buf[:])) {
	case kindMessage:
		if !st.on {
			h.role(it.role)
			h.parts('c', 'x', it.content)
		}
	case kindCall:
		h.w.text = true
		h.w.byte('f')
		h.w.field(it.callID)
		h.w.field(it.name)
		h.fieldArguments(it.args)
	case kindOutput:
		if !st.on {
			h.w.byte('o')
			h.w.field(it.callID)
			h.parts('c', 'x', it.output)
		}
	case kindReasoning:
		h.w.byte('z')
		h.parts('y', 0, it.summary)
		h.parts('k', 0, it.content)
		tagged(&h.w, 'e', it.encrypted)
	default:
		h.w.text = true
		h.w.byte('J')
		h.fieldWhole(pos)
	}
	h.w.byte('.')
	return end
}

// parts writes the text parts of t behind tag, and its refusal parts behind refusal unless it is
// 0: a string, or the parts of an array (see writeResponses).
func (h *historyWriter) parts(tag, refusal byte, t textValue) {
	switch h.v[t.pos] {
	case '"':
		tagged(&h.w, tag, t.s)
	case '[':
		h.partsOf(tag, refusal, t.pos)
	}
}

// partsOf writes the parts of the array at pos as parts does, and returns the position after it.
func (h *historyWriter) partsOf(tag, refusal byte, pos int) int {
	return h.elements(pos, func(e int) int {
		var typ, text, refused jstr
		end := h.object(e, func(key []byte, val int) int {
			switch string(key) {
			case "type":
				return h.str(val, &typ)
			case "text":
				return h.str(val, &text)
			case "refusal":
				return h.str(val, &refused)
			}
			return h.v.skip(val)
		})
		var buf [nameLen]byte
		switch partKind(typ.name(buf[:])) {
		case kindText:
			tagged(&h.w, tag, text)
		case kindRefusal:
			if refusal != 0 {
				tagged(&h.w, refusal, refused)
			}
		}
		return end
	})
}

// renderResponses writes the chat vLLM's Responses serving converts a body that continues no
// stored response to (see agents.go): the instructions as a system message, the input (a string:
// one user message; else its items, see items), and the function tools ({type: function, name,
// description, parameters}).
func renderResponses(q *query) bool {
	// The first four continue what the router cannot see, and are refused.
	q.find("previous_response_id", "conversation", "prompt", "chat_template_kwargs", "instructions", "input", "tools", "tool_choice")
	q.present()
	for _, pos := range q.at[:4] {
		if pos != 0 {
			return false
		}
	}
	c := chat{q: q}
	instructions, ok := q.str(q.at[4])
	if !ok {
		return false
	}
	if !instructions.empty() {
		c.add("system", c.jstr(instructions))
	}
	switch input := q.at[5]; {
	case input == 0:
		return false
	case q.v[input] == '"':
		j, _ := q.v.str(input)
		c.add("user", c.jstr(j))
	case !c.items(input):
		return false
	}
	ok = c.convertTools(q.at[6], "parameters", func(typ jstr, _ []int) bool { return typ.is("function") })
	if !ok {
		return false
	}
	none := false
	if choice := q.at[7]; choice != 0 && q.v[choice] == '"' {
		j, _ := q.v.str(choice)
		none = j.is("none")
	}
	return c.noToolsWhenNone(none) && c.write()
}

// items converts the input items of the array at pos: a message, a function call (joining the
// assistant message just before it: an assistant text, or other calls) and a function call's
// output (a tool message). As in vLLM, an assistant text fills the content of an assistant message
// of calls only just before it, and neither reaches back before the input's first item. A last
// message that is partial (to be continued, not answered) is refused.
func (c *chat) items(pos int) bool {
	q := c.q
	first := len(c.msgs)
	contentless := false // the last message is an assistant message without content, from the input
	partial := false     // the last item is a partial message
	names := []string{"type", "status", "role", "content", "namespace", "call_id", "name", "arguments", "output"}
	var it [9]int
	ok := q.each(pos, func(e int) bool {
		if !q.members(e, names, it[:]) {
			return false
		}
		typ, ok := q.str(it[0])
		if !ok {
			return false
		}
		var last *chatMessage
		if len(c.msgs) > first && c.msgs[len(c.msgs)-1].role == "assistant" {
			last = &c.msgs[len(c.msgs)-1]
		}
		partial = false
		switch {
		case typ.empty() || typ.is("message"):
			status, ok := q.str(it[1])
			role, ok2 := q.str(it[2])
			if !ok || !ok2 {
				return false
			}
			partial = status.is("in_progress") || status.is("incomplete")
			switch {
			case role.is("assistant"):
				text, ok := c.assistantText(it[3])
				if !ok {
					return false
				}
				if last != nil && contentless {
					last.content = c.jstr(text)
				} else {
					c.add("assistant", c.jstr(text))
				}
			case role.is("user"), role.is("system"), role.is("developer"):
				content, ok := c.inputContent(it[3])
				if !ok {
					return false
				}
				c.add(oneOf(role, "user", "system", "developer"), content)
			default:
				return false
			}
			contentless = false
		case typ.is("function_call"):
			id, ok := q.str(it[5])
			name, ok2 := q.str(it[6])
			args, ok3 := q.str(it[7])
			if it[4] != 0 || !ok || !ok2 || !ok3 || id.empty() || name.empty() {
				return false // a namespaced call is not one vLLM renders as such
			}
			if last == nil {
				c.add("assistant", span{})
				contentless = true
			}
			c.call(c.jstr(id), c.jstr(name), c.jstr(args))
		case typ.is("function_call_output"):
			id, ok := q.str(it[5])
			if !ok || id.empty() {
				return false
			}
			content, ok := c.inputContent(it[8])
			if !ok {
				return false
			}
			c.add("tool", content).callID = c.jstr(id)
			contentless = false
		default:
			return false
		}
		return true
	})
	return ok && !partial
}

// assistantText is what vLLM takes of an assistant message's content: a string, or the text of
// its first part, an output_text or input_text.
func (c *chat) assistantText(pos int) (jstr, bool) {
	q := c.q
	if pos == 0 || q.v[pos] != '[' {
		return q.str(pos)
	}
	first, more := q.v.first(pos)
	if !more {
		return jstr{plain: true}, true
	}
	var p [2]int
	if !q.members(first, []string{"type", "text"}, p[:]) {
		return jstr{}, false
	}
	typ, ok := q.str(p[0])
	if !ok || !typ.is("output_text") && !typ.is("input_text") {
		return jstr{}, false
	}
	return q.str(p[1])
}

// inputContent converts a message's content or a function call's output: a string as it is, text
// parts (input_text, output_text) as chat text parts.
func (c *chat) inputContent(pos int) (span, bool) {
	q := c.q
	switch {
	case pos == 0:
		return span{}, false
	case q.v[pos] == '"':
		j, _ := q.v.str(pos)
		return c.jstr(j), true
	}
	c.parts = c.parts[:0]
	ok := c.texts(pos, func(text jstr) { c.parts = append(c.parts, text) }, "input_text", "output_text")
	return c.textParts(), ok
}
