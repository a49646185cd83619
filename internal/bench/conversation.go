package bench

// conversation is the running state of one session: the messages sent so far and the replies
// received. It is what makes a multi-turn replay faithful: the next turn resends the server's
// actual reply, byte for byte, so a worker that cached the previous turn's prompt and reply can
// serve the whole history from cache.
type conversation struct {
	msgs []Message
}

// next returns the messages of turn t's request and records them as the conversation so far.
// The returned slice is the caller's to read; the conversation keeps its own copy.
func (c *conversation) next(t *Turn) []Message {
	if t.Fresh {
		c.msgs = c.msgs[:0]
	}
	c.msgs = append(c.msgs, t.Append...)
	return append([]Message(nil), c.msgs...)
}

// reply appends the server's answer to the conversation.
func (c *conversation) reply(content string) {
	c.msgs = append(c.msgs, Message{Role: "assistant", Content: content})
}
