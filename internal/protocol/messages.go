package protocol

import (
	"bytes"
	"encoding/json"

	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// messages.go reads an Anthropic Messages API body (see agents.go for the rules both agent
// protocols share) and writes its history key.

// The endpoints of the Messages API: a message, and the count of its prompt tokens.
const (
	MessagesPath    = "/v1/messages"
	CountTokensPath = "/v1/messages/count_tokens"
)

// Content blocks of the Messages API, as its clients send them and its servers answer with them.
type (
	// TextBlock is a text block.
	TextBlock struct {
		Type string `json:"type"` // "text"
		Text string `json:"text"`
	}
	// ToolUseBlock is a call of the tool named, with its input.
	ToolUseBlock struct {
		Type  string          `json:"type"` // "tool_use"
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	}
	// ToolResultBlock is the result of the call tool_use_id names.
	ToolResultBlock struct {
		Type      string `json:"type"` // "tool_result"
		ToolUseID string `json:"tool_use_id"`
		Content   string `json:"content"`
	}
)

// ParseMessages reads an Anthropic Messages API body (POST /v1/messages): model, stream, the
// session and hash keys, and the history key of its tools, system and messages (see
// writeMessages). The body carries a conversation (Chat) when it has messages.
//
// metadata.user_id is session-scoped: Anthropic's clients put a session's id in it (Claude
// Code's is made of the user's, the account's and the session's).
func ParseMessages(h reqkey.Header, raw []byte) (*Request, error) {
	var b messagesBody
	if err := parseObject(raw, b.member); err != nil {
		return nil, err
	}
	r := &Request{Model: string(b.model), Stream: b.stream, Chat: b.messages.pos != 0, MaxTokens: b.maxTokens,
		query: messagesQuery}
	if r.Chat {
		r.Text, _ = b.key(raw, roomFor(h, raw))
	}
	userID := string(b.userID)
	r.SessionKey = reqkey.SessionKey(h, "", []string{userID}, nil)
	r.HashKey = reqkey.HashKey(h, []string{userID}, r.Text)
	return r, nil
}

// messagesBody holds the top-level fields of a Messages body that routing reads. Byte slices may
// point into the request body.
type messagesBody struct {
	model                   []byte
	stream                  bool
	maxTokens               int // max_tokens, for the rate limits
	tools, system, messages field
	userID                  []byte // metadata.user_id
}

// member reads one top-level member whose key has been read.
func (b *messagesBody) member(s *scanner, key []byte) {
	switch string(key) {
	case "model":
		s.nullableString("model", &b.model)
	case "stream":
		b.stream = s.boolean("stream", false)
	case "max_tokens":
		b.maxTokens = s.tokenCount()
	case "tools":
		b.tools = s.toolsField(messagesToolsKind, &messagesTools)
	case "system":
		b.system = s.historyField("system", `"[`, checkSystem)
	case "messages":
		var conv convRead
		b.messages = s.historyField("messages", "[", func(s *scanner) {
			_, conv = s.conversation(messagesMessagesKind, checkMessagesMessage)
		})
		b.messages.conv = conv
	case "metadata":
		s.idIn("user_id", &b.userID)
	default:
		s.skip(false)
	}
}

func checkSystem(s *scanner) {
	s.hist.size += len("s.") + s.blocksSize()
}

// checkMessagesMessage reads one element of messages.
func checkMessagesMessage(s *scanner) {
	if !s.objectElement() {
		return
	}
	size := len(".")
	roleless := true // the last role may be absent (or null): "r" and an empty field are written
	s.object(func(s *scanner, key []byte) {
		switch string(key) {
		case "role":
			raw, n, ok := s.stringField("role")
			if ok {
				size += roleSize(raw, n)
			}
			roleless = !ok
		case "content":
			s.in("content")
			size += s.blocksSize()
			s.out()
		default:
			s.skip(false)
		}
	})
	if roleless {
		size += len("r") + fieldSize(0)
	}
	s.hist.size += size
}

// blocksSize reads a free-form content of blocks and returns the most bytes the key takes of it:
// of a string, or of each block of an array.
func (s *scanner) blocksSize() int {
	switch s.peek() {
	case '"':
		return s.textSize()
	case '[':
		size := 0
		s.array(func(s *scanner) { size += s.blockSize() })
		return size
	}
	s.skip(true)
	return 0
}

// blockSize reads one element of a content array and returns the most bytes the key takes of it:
// that of its kind, known once it is read whole, summed over the members the kind reads.
func (s *scanner) blockSize() int {
	if s.peek() != '{' {
		s.skip(true)
		return 0
	}
	at := s.counts()
	var buf [nameLen]byte
	var typ []byte
	var text, id, callID, name, input, content, thinking, data int
	hasID := false
	streamed := 0 // what a tool result's content written as it is read may take (see block)
	s.object(func(s *scanner, key []byte) {
		switch string(key) {
		case "type":
			typ = nil
			if s.peek() == '"' {
				typ = s.typeName(buf[:])
			} else {
				s.skip(true)
			}
		case "text":
			text += s.textSize()
		case "id":
			id += s.stringSize()
		case "tool_use_id":
			hasID = s.peek() == '"'
			callID += s.stringSize()
		case "name":
			name += s.stringSize()
		case "input":
			input += s.canonicalSize()
		case "content":
			array := s.peek() == '['
			size := s.blocksSize()
			content += size
			if array && hasID && blockKind(typ) == kindOutput {
				streamed = max(streamed, len("o")+fieldSize(0)+callID+size)
			}
		case "thinking":
			thinking += s.textSize()
		case "data":
			data += s.textSize()
		default:
			s.skip(true)
		}
	})
	var size int
	switch blockKind(typ) {
	case kindText:
		size = text
	case kindNone:
	case kindCall:
		size = len("f") + 3*fieldSize(0) + id + name + input
	case kindOutput:
		return len("o;") + fieldSize(0) + callID + content
	case kindThinking:
		size = thinking
	case kindRedacted:
		size = data
	default:
		size = len("J") + s.canonicalBound(at)
	}
	// A tool result's content written as it was read (see block) is taken back when a later type
	// makes the block of another kind, but it was written first: the bound allows for it.
	return size + streamed
}

// blockKind is the kind of a content block of the type typ.
func blockKind(typ []byte) kind {
	switch string(typ) {
	case "text":
		return kindText
	case "image", "document":
		return kindNone
	case "tool_use":
		return kindCall
	case "tool_result":
		return kindOutput
	case "thinking":
		return kindThinking
	case "redacted_thinking":
		return kindRedacted
	}
	return kindWhole
}

// key writes the history key of the body raw; see writeMessages.
func (b *messagesBody) key(raw []byte, room keyRoom) (key string, onePass bool) {
	return agentKey(raw, room, func(h *historyWriter) { h.writeMessages(b) }, b.tools, b.system, b.messages)
}

// writeMessages writes the history key of a Messages body, in chat's framing (see historyKey)
// extended to content blocks, so that the key of a conversation is a byte prefix of the key of
// any continuation of it: the same tools and system, messages appended. Tools come first (see
// toolSchema; a tool of no type or of type custom is written by name, description and
// input_schema), then the system written as a system message, then each message in order, as
// Anthropic's prompt cache orders them.
//
//	key     = {tool} ["s" {block} "."] {message}
//	message = role {block} "."                                 role as chat's
//	block   = "c" text·                                        text (a string content is one)
//	        | "f" id· name· input·                             tool_use, its input as canonical JSON
//	        | "o" tool_use_id· {block} (";" | "!")             tool_result ("!" ends an error's)
//	        | "k" thinking·                                    thinking
//	        | "e" data·                                        redacted_thinking
//	        | "J" block·                                       a block of any other type, as canonical JSON
//
// (x· is the field x: its bytes, then 0xFF; see historyKey.)
// Image and document blocks write nothing, as chat's images do, nor do empty texts.
// cache_control is never written: not a tool's nor a block's. Claude Code moves its marker to the
// newest message every turn, so a key that held it would lose the prefix property.
func (h *historyWriter) writeMessages(b *messagesBody) {
	if b.tools.pos != 0 {
		h.toolsPart(b.tools.tools, func() { h.agentTools(b.tools.pos, &messagesTools) })
	}
	if b.system.pos != 0 {
		h.w.byte('s')
		h.blocks(textValue{pos: b.system.pos, s: h.jstr(b.system.pos)})
		h.w.byte('.')
	}
	h.conversationPart(b.messages.conv, func(pos int) int {
		if h.v[pos] == '{' {
			return h.message(pos)
		}
		return h.v.skip(pos)
	})
}

// message writes the message at pos and returns the position after it. A content array after a
// role is written as it is read (see streaming).
func (h *historyWriter) message(pos int) int {
	var role jstr
	var content textValue
	var st streaming
	hasRole := false
	end := h.object(pos, func(key []byte, val int) int {
		switch string(key) {
		case "role":
			st.undo(&h.w)
			hasRole = h.v[val] == '"'
			return h.str(val, &role)
		case "content":
			return h.streamed(&st, &content, val, hasRole, func() { h.role(role) }, h.blockArray)
		}
		return h.v.skip(val)
	})
	if !st.on {
		h.role(role)
		h.blocks(content)
	}
	h.w.byte('.')
	return end
}

// blocks writes the content t: a string, or the blocks of an array.
func (h *historyWriter) blocks(t textValue) {
	switch h.v[t.pos] {
	case '"':
		textPart(&h.w, t.s)
	case '[':
		h.elements(t.pos, h.block)
	}
}

// blockArray writes the blocks of the array at pos and returns the position after it.
func (h *historyWriter) blockArray(pos int) int { return h.elements(pos, h.block) }

// block is a content block as far as the key reads it: its strings, and where its other values
// are (0 when absent).
type block struct {
	typ, text, id, callID, name, thinking, data jstr
	content                                     textValue
	input, isError                              int
}

// block writes the content block at pos and returns the position after it. A tool result's
// content array after its type and tool_use_id is written as it is read (see streaming).
func (h *historyWriter) block(pos int) int {
	var b block
	var st streaming
	var buf [nameLen]byte
	hasID := false
	end := h.object(pos, func(key []byte, val int) int {
		switch string(key) {
		case "type":
			st.undo(&h.w)
			return h.str(val, &b.typ)
		case "text":
			return h.str(val, &b.text)
		case "id":
			return h.str(val, &b.id)
		case "tool_use_id":
			st.undo(&h.w)
			hasID = h.v[val] == '"'
			return h.str(val, &b.callID)
		case "content":
			stream := hasID && blockKind(b.typ.name(buf[:])) == kindOutput
			return h.streamed(&st, &b.content, val, stream, func() { h.w.byte('o'); h.w.field(b.callID) }, h.blockArray)
		case "name":
			return h.str(val, &b.name)
		case "thinking":
			return h.str(val, &b.thinking)
		case "data":
			return h.str(val, &b.data)
		case "input":
			return h.at(val, &b.input)
		case "is_error":
			return h.at(val, &b.isError)
		}
		return h.v.skip(val)
	})
	switch blockKind(b.typ.name(buf[:])) {
	case kindText:
		textPart(&h.w, b.text)
	case kindCall:
		h.w.text = true
		h.w.byte('f')
		h.w.field(b.id)
		h.w.field(b.name)
		h.fieldCanonical(b.input)
	case kindOutput:
		if !st.on {
			h.w.byte('o')
			h.w.field(b.callID)
			h.blocks(b.content)
		}
		if b.isError != 0 && h.v[b.isError] == 't' {
			h.w.byte('!') // the end of an error's result
		} else {
			h.w.byte(';')
		}
	case kindThinking:
		tagged(&h.w, 'k', b.thinking)
	case kindRedacted:
		tagged(&h.w, 'e', b.data)
	case kindWhole:
		h.w.text = true
		h.w.byte('J')
		h.fieldWhole(pos)
	}
	return end
}

// billingHeader starts the text block Claude Code adds to its system prompt with a hash of the
// request, which vLLM's Messages serving leaves out of the prompt.
const billingHeader = "x-anthropic-billing-header"

// renderMessages writes the chat vLLM's Messages serving converts the body to (see agents.go):
// the system (a string, or its text blocks, Claude Code's billing header left out) as a system
// message, then each message (see message), and the client tools ({name, description,
// input_schema}, with no type or type custom).
func renderMessages(q *query) bool {
	q.find("chat_template_kwargs", "system", "messages", "tools", "tool_choice")
	q.present()
	c := chat{q: q}
	if q.at[0] != 0 || !c.system(q.at[1]) {
		return false // chat_template_kwargs
	}
	n := 0
	if !q.each(q.at[2], func(e int) bool { n++; return c.message(e) }) || n == 0 {
		return false
	}
	ok := c.convertTools(q.at[3], "input_schema", func(typ jstr, t []int) bool {
		return (typ.empty() || typ.is("custom")) && t[4] == 0 // not defer_loading
	})
	if !ok {
		return false
	}
	none := false
	if choice := q.at[4]; choice != 0 {
		var t [1]int
		if !q.members(choice, []string{"type"}, t[:]) {
			return false
		}
		typ, ok := q.str(t[0])
		if !ok {
			return false
		}
		none = typ.is("none")
	}
	return c.noToolsWhenNone(none) && c.write()
}

// system converts the system prompt at pos (0: none) into a system message when it has text.
func (c *chat) system(pos int) bool {
	q := c.q
	c.parts = c.parts[:0]
	if pos != 0 && q.v[pos] == '"' {
		j, _ := q.v.str(pos)
		c.parts = append(c.parts, j)
	} else if !c.texts(pos, func(text jstr) {
		if c.text = text.appendTo(c.text[:0]); !bytes.HasPrefix(c.text, []byte(billingHeader)) {
			c.parts = append(c.parts, text)
		}
	}, "text") {
		return false
	}
	if content := c.joined(); content.to-content.from > len(`""`) {
		c.add("system", content)
	}
	return true
}

// message converts the message at pos: a user message's tool results first, one tool message
// each, then its text as a user message (none when it has no text); an assistant message's text
// and tool_use blocks as one assistant message of text and tool calls. A text block's text and
// redacted thinking are taken as vLLM takes them; any other block is refused.
func (c *chat) message(pos int) bool {
	q := c.q
	var m [2]int
	if !q.members(pos, []string{"role", "content"}, m[:]) {
		return false
	}
	role, ok := q.str(m[0])
	r := oneOf(role, "user", "assistant")
	if !ok || r == "" {
		return false
	}
	if m[1] != 0 && q.v[m[1]] == '"' {
		j, _ := q.v.str(m[1])
		c.add(r, c.jstr(j))
		return true
	}
	c.parts = c.parts[:0]
	calls := c.calls[:0:0]
	names := []string{"type", "text", "id", "name", "input", "tool_use_id", "content"}
	var b [7]int
	ok = q.each(m[1], func(e int) bool {
		if !q.members(e, names, b[:]) {
			return false
		}
		typ, ok := q.str(b[0])
		switch {
		case !ok:
			return false
		case typ.is("text"):
			text, ok := q.str(b[1])
			if ok && !text.empty() {
				c.parts = append(c.parts, text)
			}
			return ok
		case typ.is("redacted_thinking"): // opaque, and left out by vLLM
			return true
		case typ.is("tool_use") && r == "assistant":
			call, ok := c.toolUse(b[2], b[3], b[4])
			calls = append(calls, call)
			return ok
		case typ.is("tool_result") && r == "user":
			return c.toolResult(b[5], b[6])
		}
		return false
	})
	if !ok {
		return false
	}
	if r == "user" && len(c.parts) == 0 {
		return true
	}
	var content span
	switch len(c.parts) {
	case 0:
	case 1:
		content = c.jstr(c.parts[0])
	default:
		content = c.textParts()
	}
	c.add(r, content)
	for _, call := range calls {
		c.call(call.id, call.name, call.args)
	}
	return true
}

// toolUse converts a tool_use block, whose id, name and input are at the positions given, to a
// tool call: its input becomes the call's arguments as Python's json.dumps writes it, which is
// how vLLM writes them. A block without an id is refused: vLLM makes one up from the clock.
func (c *chat) toolUse(idAt, nameAt, input int) (toolCall, bool) {
	id, ok := c.q.str(idAt)
	if !ok || id.empty() {
		return toolCall{}, false
	}
	name, ok := c.q.str(nameAt)
	if !ok {
		return toolCall{}, false
	}
	call := toolCall{id: c.jstr(id), name: c.jstr(name)}
	args := []byte("{}")
	if input != 0 {
		if c.q.v[input] != '{' {
			return toolCall{}, false
		}
		var err error
		if args, err = appendPython(c.text[:0], c.q.v, input); err != nil {
			return toolCall{}, false
		}
		c.text = args
	}
	from := len(c.out)
	c.out = appendString(c.out, args)
	call.args = c.json(from)
	return call, true
}

// toolResult converts a tool_result block, whose tool_use_id and content are at the positions
// given, to a tool message: its content a string, or its text blocks joined by newlines.
func (c *chat) toolResult(idAt, content int) bool {
	q := c.q
	id, ok := q.str(idAt)
	if !ok || id.empty() {
		return false
	}
	c.text = c.text[:0]
	n := 0 // texts joined
	if content == 0 || q.v[content] == '"' {
		text, _ := q.str(content)
		c.text = text.appendTo(c.text)
	} else if !c.texts(content, func(text jstr) {
		if n++; n > 1 {
			c.text = append(c.text, '\n')
		}
		c.text = text.appendTo(c.text)
	}, "text") {
		return false
	}
	from := len(c.out)
	c.out = appendString(c.out, c.text)
	m := c.add("tool", c.json(from))
	m.callID = c.jstr(id)
	return true
}
