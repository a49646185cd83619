package reqkey

// messages.go reads an Anthropic Messages API body (see agents.go for the rules both agent
// protocols share) and writes its history key.

// messagesBody holds the top-level fields of a Messages body that routing reads. Byte slices may
// point into the request body.
type messagesBody struct {
	model                   []byte
	stream                  bool
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
	case "tools":
		b.tools = s.historyField("tools", "[", checkMessagesTools)
	case "system":
		b.system = s.historyField("system", `"[`, checkSystem)
	case "messages":
		b.messages = s.historyField("messages", "[", checkMessages)
	case "metadata":
		s.idIn("user_id", &b.userID)
	default:
		s.skip(false)
	}
}

func checkSystem(s *scanner) {
	s.hist.size += len("s.") + s.blocksSize()
}

func checkMessages(s *scanner) { s.array(checkMessagesMessage) }

// checkMessagesMessage reads one element of messages.
func checkMessagesMessage(s *scanner) {
	switch s.peek() {
	case 'n':
		s.null()
		return
	case '{':
	default:
		s.mismatch()
		return
	}
	size := len(".")
	roleless := true // the last role may be absent (or null): "r0:" is written
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
		size += len("r0:")
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
	start, grow, floats, keys := s.pos, s.grow, s.floats, s.keys
	var buf [nameLen]byte
	var typ []byte
	var text, id, callID, name, input, content, thinking, data int
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
			callID += s.stringSize()
		case "name":
			name += s.stringSize()
		case "input":
			input += s.canonicalSize()
		case "content":
			content += s.blocksSize()
		case "thinking":
			thinking += s.textSize()
		case "data":
			data += s.textSize()
		default:
			s.skip(true)
		}
	})
	switch blockKind(typ) {
	case kindText:
		return text
	case kindNone:
		return 0
	case kindCall:
		return len("f0:0:0:") + id + name + input
	case kindOutput:
		return len("o0:!;") + callID + content
	case kindThinking:
		return thinking
	case kindRedacted:
		return data
	}
	return len("J") + s.canonicalBound(start, grow, floats, keys)
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
func (b *messagesBody) key(raw []byte, limit int) (key string, onePass bool) {
	h := newHistoryWriter(valid(raw), max(b.tools.members, b.system.members, b.messages.members))
	bound := keyBound{size: b.tools.size + b.system.size + b.messages.size, named: b.tools.named}
	return h.writeKey(bound, limit, func() { h.writeMessages(b) })
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
//	block   = "c" lp(text)                                     text (a string content is one)
//	        | "f" lp(id) lp(name) lp(input as canonical JSON)  tool_use
//	        | "o" lp(tool_use_id) ["!"] {block} ";"            tool_result ("!": is_error)
//	        | "k" lp(thinking)                                 thinking
//	        | "e" lp(data)                                     redacted_thinking
//	        | "J" lp(block as canonical JSON)                  a block of any other type
//
// Image and document blocks write nothing, as chat's images do, nor do empty texts.
// cache_control is never written: not a tool's nor a block's. Claude Code moves its marker to the
// newest message every turn, so a key that held it would lose the prefix property.
func (h *historyWriter) writeMessages(b *messagesBody) {
	if b.tools.pos != 0 {
		h.agentTools(b.tools.pos, &messagesTools)
	}
	if b.system.pos != 0 {
		h.w.byte('s')
		h.blocks(b.system.pos)
		h.w.byte('.')
	}
	h.elements(b.messages.pos, func(pos int) int {
		var f fields
		end := h.readFields(pos, &f, messageSlot)
		h.role(h.jstr(f.role))
		h.blocks(f.content)
		h.w.byte('.')
		return end
	})
}

func messageSlot(f *fields, key []byte) *int {
	switch string(key) {
	case "role":
		return &f.role
	case "content":
		return &f.content
	}
	return nil
}

// blocks writes the content at pos (0: none): a string, or the blocks of an array.
func (h *historyWriter) blocks(pos int) {
	switch h.v[pos] {
	case '"':
		h.text('c', pos)
	case '[':
		h.elements(pos, h.block)
	}
}

// block writes the content block at pos and returns the position after it.
func (h *historyWriter) block(pos int) int {
	var f fields
	end := h.readFields(pos, &f, blockSlot)
	var buf [nameLen]byte
	switch blockKind(h.kindName(f.typ, buf[:])) {
	case kindText:
		h.text('c', f.text)
	case kindCall:
		h.w.text = true
		h.w.byte('f')
		h.lpString(f.id)
		h.lpString(f.name)
		h.lpCanonical(f.args)
	case kindOutput:
		h.w.byte('o')
		h.lpString(f.callID)
		if f.isError != 0 && h.v[f.isError] == 't' {
			h.w.byte('!')
		}
		h.blocks(f.content)
		h.w.byte(';')
	case kindThinking:
		h.text('k', f.thinking)
	case kindRedacted:
		h.text('e', f.data)
	case kindWhole:
		h.w.text = true
		h.w.byte('J')
		h.lpWhole(pos)
	}
	return end
}

func blockSlot(f *fields, key []byte) *int {
	switch string(key) {
	case "type":
		return &f.typ
	case "text":
		return &f.text
	case "id":
		return &f.id
	case "tool_use_id":
		return &f.callID
	case "name":
		return &f.name
	case "input":
		return &f.args
	case "content":
		return &f.content
	case "is_error":
		return &f.isError
	case "thinking":
		return &f.thinking
	case "data":
		return &f.data
	}
	return nil
}
