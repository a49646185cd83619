package bench

// conversation is the running state of one session: the messages sent so far and the replies
// received. It is what makes a multi-turn replay faithful: the next turn resends the server's
// actual reply, byte for byte, so a worker that cached the previous turn's prompt and reply can
// serve the whole history from cache.
type conversation struct {
	msgs []turnMessage
}

// turnMessage is a message of a conversation: a workload's message, a server's reply with the
// tool calls it made, or a tool result answering one of them.
type turnMessage struct {
	Message
	calls  []ToolCall // an assistant reply's tool calls
	callID string     // a tool result: the call it answers
}

// ToolCall is one tool call of a reply, as the server sent it. Responses and Messages servers
// may answer with one; the bench keeps a chat reply's text only.
type ToolCall struct {
	ID        string // Responses call_id, Messages tool_use id
	Name      string
	Arguments string // JSON text, verbatim
}

// next returns the messages of turn t's request, and the index where the turn's own begin, and
// records them as the conversation so far. The returned slice is the caller's to read; the
// conversation keeps its own copy.
//
// When the previous reply called tools, the turn's first user message is the tools' result:
// it becomes a "tool" message answering the first call, followed by an empty result for each
// other call, since an API that lets a reply call tools wants every call answered. Workloads
// write tool results as user messages, which is what they are to a chat server.
func (c *conversation) next(t *Turn) ([]turnMessage, int) {
	if t.Fresh {
		c.msgs = c.msgs[:0]
	}
	fresh := len(c.msgs)
	var calls []ToolCall
	if n := len(c.msgs); n > 0 && c.msgs[n-1].Role == "assistant" {
		calls = c.msgs[n-1].calls
	}
	for _, m := range t.Append {
		if len(calls) > 0 && m.Role == "user" {
			c.msgs = append(c.msgs, turnMessage{Message: Message{Role: "tool", Content: m.Content}, callID: calls[0].ID})
			for _, other := range calls[1:] {
				c.msgs = append(c.msgs, turnMessage{Message: Message{Role: "tool"}, callID: other.ID})
			}
			calls = nil
			continue
		}
		c.msgs = append(c.msgs, turnMessage{Message: m})
	}
	return append([]turnMessage(nil), c.msgs...), fresh
}

// reply appends the server's answer to the conversation: its text and its tool calls.
func (c *conversation) reply(content string, calls []ToolCall) {
	c.msgs = append(c.msgs, turnMessage{Message: Message{Role: "assistant", Content: content}, calls: calls})
}

// messages returns the plain messages of ms: the text of each, without tool calls.
func messages(ms []turnMessage) []Message {
	out := make([]Message, len(ms))
	for i := range ms {
		out[i] = ms[i].Message
	}
	return out
}
