package prompt

// The chat template renders a conversation the way vLLM's chat templates do:
// an optional tools preamble, then every message as a role marker, its
// content and its tool calls, closed by an end marker; and, when a reply is
// to be generated, the opening of the assistant turn.
//
//	<|tools|>\n{tools JSON}<|end|>\n          (only when the request has tools)
//	<|system|>\nYou are terse.<|end|>\n
//	<|user|>\nHello<|end|>\n
//	<|assistant|>\nHi there<|tool_call|>name {args}<|end|>\n
//	<|tool|>\n{"ok":true}<|end|>\n
//	<|assistant|>\n                             (the generation prompt)
//
// A generated reply is cached as the reply tokens followed by AssistantEnd,
// which is exactly what the template renders for that assistant message when
// the client sends it back in the next turn: the rendered next turn starts
// with every token of the previous turn's prompt and reply.

// AssistantEnd closes every message, including a generated assistant reply.
const AssistantEnd = "<|end|>\n"

// ToolCallMarker opens each tool call of an assistant message.
const ToolCallMarker = "<|tool_call|>"

// Message is one chat message, already reduced to text.
type Message struct {
	Role      string
	Content   string
	ToolCalls []ToolCall
}

// ToolCall is a function call an assistant message made.
type ToolCall struct {
	Name      string
	Arguments string
}

// RenderChat appends the rendered conversation to seq. tools is the
// request's tools array as compact JSON, or empty. With generate set the
// assistant turn is opened for a reply.
func RenderChat(seq *Sequence, tools []byte, msgs []Message, generate bool) {
	// Each piece is appended as bytes and cut into tokens as a whole; every
	// piece starts with '<' after a newline, so the result equals cutting the
	// entire rendering at once.
	start := len(seq.Text)
	if len(tools) > 0 {
		seq.Text = append(seq.Text, "<|tools|>\n"...)
		seq.Text = append(seq.Text, tools...)
		seq.Text = append(seq.Text, AssistantEnd...)
	}
	for i := range msgs {
		m := &msgs[i]
		seq.Text = append(seq.Text, "<|"...)
		seq.Text = append(seq.Text, m.Role...)
		seq.Text = append(seq.Text, "|>\n"...)
		seq.Text = append(seq.Text, m.Content...)
		for _, tc := range m.ToolCalls {
			seq.Text = AppendToolCall(seq.Text, tc)
		}
		seq.Text = append(seq.Text, AssistantEnd...)
	}
	if generate {
		seq.Text = append(seq.Text, "<|assistant|>\n"...)
	}
	seq.Ends = appendEnds(seq.Ends, seq.Text, start)
}

// AppendToolCall appends the rendering of one tool call to dst: the marker,
// the function name, a space and the arguments string. A reply that calls a
// tool is generated as exactly these tokens, so it is cached as what the next
// turn renders for it.
func AppendToolCall(dst []byte, tc ToolCall) []byte {
	dst = append(dst, ToolCallMarker...)
	dst = append(dst, tc.Name...)
	dst = append(dst, ' ')
	return append(dst, tc.Arguments...)
}
