package protocol

import "math"

// KeyPasses is the history key of a chat body written both ways, and what the writer took.
type KeyPasses struct {
	OnePass, TwoPass string // the key written in one pass, into a buffer of its bound, and in two
	Written, Bound   int    // the bytes the writer writes (text or not), and their bound
	MembersOutgrown  bool   // a canonical value has more members than recs was sized for
	NamedOutgrown    bool   // more tools have a name than the bound allows for
	// BufferOutgrown says that writing into a buffer of the bound's size outgrew it at some
	// point, though the key may fit in the end.
	BufferOutgrown bool
}

// HistoryKeyBothWays writes the history key of the chat body raw in one pass and in two. ok is
// false when raw does not parse or is not a chat.
func HistoryKeyBothWays(raw []byte) (k KeyPasses, ok bool) {
	var b body
	if parseObject(raw, b.member) != nil || b.messages == nil {
		return k, false
	}
	k.OnePass, _ = writeHistoryKey(b.tools, b.messages, keyRoom{limit: math.MaxInt})
	k.TwoPass, _ = writeHistoryKey(b.tools, b.messages, keyRoom{limit: -1})
	h := newHistoryWriter(valid(b.messages.data), max(b.messages.members, b.tools.bound().members))
	h.inOrder = b.messages.inOrder
	members := cap(h.c.recs)
	h.write(b.tools, b.messages)
	k.Written, k.Bound = h.w.n, b.messages.size+b.tools.bound().size
	k.MembersOutgrown = cap(h.c.recs) != members
	return k, true
}

// WritesHistoryKeyInOnePass reports whether Parse writes the history key of the chat body raw in
// one pass, and returns the key.
func WritesHistoryKeyInOnePass(raw []byte) (key string, onePass bool) {
	var b body
	if parseObject(raw, b.member) != nil {
		return "", false
	}
	return writeHistoryKey(b.tools, b.messages, roomFor(nil, raw))
}

// RoutingTextBothWays renders the routing text of the non-chat body raw in one pass, into a
// buffer of its bound, and in two, counting it first, and reports whether a bound was outgrown.
// ok is false when raw does not parse or is a chat.
func RoutingTextBothWays(raw []byte) (onePass, twoPass string, outgrown, ok bool) {
	var b body
	if parseObject(raw, b.member) != nil || b.messages != nil {
		return "", "", false, false
	}
	onePass, twoPass = routingText(&b, keyRoom{limit: math.MaxInt}), routingText(&b, keyRoom{limit: -1})
	for _, p := range []prompt{b.text, b.prompt, b.inputIDs} {
		if p.raw != nil {
			var count keyWriter
			renderPrompt(&count, valid(p.raw), 0)
			outgrown = outgrown || count.n > p.size
		}
	}
	return onePass, twoPass, outgrown, true
}

// RendersRoutingTextInOnePass reports whether Parse renders the routing text of the non-chat body
// raw in one pass: whether the bound of the value it renders is within the limit.
func RendersRoutingTextInOnePass(raw []byte) bool {
	var b body
	if parseObject(raw, b.member) != nil {
		return false
	}
	for _, p := range []prompt{b.text, b.prompt, b.inputIDs} {
		if p.raw != nil {
			return p.size <= onePassLimit(raw)
		}
	}
	return false
}

// agentBody is a parsed Responses or Messages body, as far as the key reads it.
type agentBody struct {
	key     func(limit int) (string, bool)
	write   func(h *historyWriter)
	bound   keyBound
	members int
}

// parseAgent parses raw as a body of protocol ("responses" or "messages"); ok is false when it
// does not parse or carries no conversation.
func parseAgent(name string, raw []byte) (a agentBody, ok bool) {
	switch name {
	case "responses":
		var b responsesBody
		if parseObject(raw, b.member) != nil || b.input.pos == 0 {
			return a, false
		}
		return agentBody{
			key:     func(limit int) (string, bool) { return b.key(raw, keyRoom{limit: limit}) },
			write:   func(h *historyWriter) { h.writeResponses(&b) },
			bound:   keyBound{size: b.tools.size + b.instructions.size + b.input.size, named: b.tools.named},
			members: max(b.tools.members, b.input.members),
		}, true
	case "messages":
		var b messagesBody
		if parseObject(raw, b.member) != nil || b.messages.pos == 0 {
			return a, false
		}
		return agentBody{
			key:     func(limit int) (string, bool) { return b.key(raw, keyRoom{limit: limit}) },
			write:   func(h *historyWriter) { h.writeMessages(&b) },
			bound:   keyBound{size: b.tools.size + b.system.size + b.messages.size, named: b.tools.named},
			members: max(b.tools.members, b.system.members, b.messages.members),
		}, true
	}
	panic("unknown protocol " + name)
}

// AgentKeyBothWays is HistoryKeyBothWays for a body of protocol, "responses" or "messages".
func AgentKeyBothWays(name string, raw []byte) (k KeyPasses, ok bool) {
	a, ok := parseAgent(name, raw)
	if !ok {
		return k, false
	}
	k.OnePass, _ = a.key(math.MaxInt)
	k.TwoPass, _ = a.key(-1)
	h := newHistoryWriter(valid(raw), a.members)
	a.write(&h)
	k.Written, k.Bound = h.w.n, a.bound.size
	k.MembersOutgrown = cap(h.c.recs) != a.members
	k.NamedOutgrown = h.named > a.bound.named
	h = newHistoryWriter(valid(raw), a.members)
	h.named = a.bound.named
	h.w = writerOf(a.bound.size)
	a.write(&h)
	k.BufferOutgrown = cap(h.w.buf) != a.bound.size
	return k, true
}

// WritesAgentKeyInOnePass reports whether the parser of protocol writes the history key of raw in
// one pass, and returns the key.
func WritesAgentKeyInOnePass(name string, raw []byte) (key string, onePass bool) {
	a, ok := parseAgent(name, raw)
	if !ok {
		return "", false
	}
	return a.key(onePassLimit(raw))
}

// Routing is what r holds for the policies, without which /tokenize query its protocol renders,
// so that the parses of two protocols, or a parse and the encoding/json reference, compare by the
// keys they derived.
func Routing(r *Request) Request {
	c := *r
	c.query = notTokenized
	return c
}

// FreshToolsMemo has the parsers use an empty tools memo until restore puts the earlier one back.
func FreshToolsMemo() (restore func()) {
	old := rememberedTools
	rememberedTools = &toolsMemo{seed: old.seed}
	return func() { rememberedTools = old }
}

// ToolsRemembered reports whether the tools memo holds the array raw, as a tools field of any API.
func ToolsRemembered(raw []byte) bool {
	for _, kind := range []byte{chatToolsKind, responsesToolsKind, messagesToolsKind} {
		if e := rememberedTools.find(kind, raw); e != nil && len(e.raw) == len(raw) {
			return true
		}
	}
	return false
}

// FreshConversationMemo has the parsers use an empty conversation memo until restore puts the
// earlier one back.
func FreshConversationMemo() (restore func()) {
	old := rememberedConversations
	rememberedConversations = newConvMemo(convMemoBytes)
	return func() { rememberedConversations = old }
}

// ConversationRemembered reports whether the conversation memo holds a beginning of the array raw,
// as a conversation of any API.
func ConversationRemembered(raw []byte) bool {
	for _, kind := range []byte{chatMessagesKind, messagesMessagesKind} {
		if rememberedConversations.find(kind, raw) != nil {
			return true
		}
	}
	return false
}
