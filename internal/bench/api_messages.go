package bench

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// messagesAPI sends POST /v1/messages, Anthropic's Messages API, with the whole conversation
// every turn. The leading system messages become "system"; the others become user and
// assistant messages, consecutive messages of one role merged into one message of blocks (a
// message of one text keeps string content). A reply that called a tool is resent with its
// tool_use blocks, and the tool result that follows as a tool_result block. Tools become
// {name, description, input_schema}.
//
// With session ids (header or body mode) "metadata": {"user_id": ...} is the session id; header
// mode adds the x-claude-code-session-id header, the header Claude Code sends.
type messagesAPI struct{}

// anthropicVersion is the anthropic-version header every request carries.
const anthropicVersion = "2023-06-01"

// headerClaudeSessionID is the session header of Claude Code.
const headerClaudeSessionID = "x-claude-code-session-id"

// messagesRequest is the body of a Messages turn.
type messagesRequest struct {
	Model     string             `json:"model"`
	System    string             `json:"system,omitempty"`
	Messages  []anthropicMessage `json:"messages"`
	Tools     json.RawMessage    `json:"tools,omitempty"`
	MaxTokens int                `json:"max_tokens"`
	IgnoreEOS bool               `json:"ignore_eos,omitempty"`
	Stream    bool               `json:"stream"`
	Metadata  *messagesMetadata  `json:"metadata,omitempty"`
}

type messagesMetadata struct {
	UserID string `json:"user_id"`
}

// anthropicMessage has string content, or blocks when it holds more than one text.
type anthropicMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"` // string or []any of the block types below
}

type anthropicTool struct {
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	InputSchema json.RawMessage `json:"input_schema"`
}

// anthropicUsage holds the usage fields of message_start and message_delta; a field absent from
// an event leaves the count read before.
type anthropicUsage struct {
	InputTokens              *int `json:"input_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens"`
	OutputTokens             *int `json:"output_tokens"`
}

// messagesEvent is the part of a Messages stream event the bench reads.
type messagesEvent struct {
	Type    string `json:"type"`
	Message *struct {
		ID    string          `json:"id"`
		Usage *anthropicUsage `json:"usage"`
	} `json:"message"`
	Index        int `json:"index"`
	ContentBlock *struct {
		Type  string          `json:"type"`
		ID    string          `json:"id"`
		Name  string          `json:"name"`
		Input json.RawMessage `json:"input"`
	} `json:"content_block"`
	Delta *struct {
		Type        string `json:"type"`
		Text        string `json:"text"`
		Thinking    string `json:"thinking"`
		PartialJSON string `json:"partial_json"`
	} `json:"delta"`
	Usage *anthropicUsage `json:"usage"`
	Error *apiError       `json:"error"`
}

func (messagesAPI) path() string  { return protocol.MessagesPath }
func (messagesAPI) chains() bool  { return false }
func (messagesAPI) final() string { return "message_stop" }
func (messagesAPI) tools(chat json.RawMessage) (json.RawMessage, error) {
	return convertTools(chat, func(f *chatFunction) anthropicTool {
		schema := f.Function.Parameters
		if len(schema) == 0 {
			schema = json.RawMessage(`{"type":"object"}`)
		}
		return anthropicTool{Name: f.Function.Name, Description: f.Function.Description, InputSchema: schema}
	})
}

func (messagesAPI) body(x *exchange) any {
	system, lead := splitSystem(x.msgs)
	r := &messagesRequest{Model: x.model, System: system, Tools: x.tools, MaxTokens: x.maxTokens,
		IgnoreEOS: x.ignoreEOS, Stream: true}
	if x.sessionID != "" {
		r.Metadata = &messagesMetadata{UserID: x.sessionID}
	}
	blocks := make([][]any, 0, len(x.msgs)-lead)
	for _, m := range x.msgs[lead:] {
		role, add := "user", []any{protocol.TextBlock{Type: "text", Text: m.Content}}
		switch {
		case m.Role == "assistant":
			role = "assistant"
			if len(m.calls) > 0 {
				add = add[:0]
				if m.Content != "" {
					add = append(add, protocol.TextBlock{Type: "text", Text: m.Content})
				}
				for _, c := range m.calls {
					add = append(add, protocol.ToolUseBlock{Type: "tool_use", ID: c.ID, Name: c.Name, Input: toolInput(c.Arguments)})
				}
			}
		case m.callID != "":
			add = []any{protocol.ToolResultBlock{Type: "tool_result", ToolUseID: m.callID, Content: m.Content}}
		}
		if n := len(r.Messages); n > 0 && r.Messages[n-1].Role == role {
			blocks[n-1] = append(blocks[n-1], add...)
			continue
		}
		r.Messages = append(r.Messages, anthropicMessage{Role: role})
		blocks = append(blocks, add)
	}
	for i, b := range blocks {
		if t, ok := b[0].(protocol.TextBlock); ok && len(b) == 1 {
			r.Messages[i].Content = t.Text
		} else {
			r.Messages[i].Content = b
		}
	}
	return r
}

// toolInput is a call's arguments as a tool_use input: the JSON as the server sent it, or an
// empty object when there was none.
func toolInput(args string) json.RawMessage {
	if args == "" {
		return json.RawMessage("{}")
	}
	return json.RawMessage(args)
}

func (messagesAPI) header(h http.Header, x *exchange) {
	h.Set("anthropic-version", anthropicVersion)
	if x.mode == SessionHeader && x.sessionID != "" {
		h.Set(headerClaudeSessionID, x.sessionID)
	}
}

func (messagesAPI) event(data []byte, st *stream) error {
	var ev messagesEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return err
	}
	switch ev.Type {
	case "message_start":
		if ev.Message != nil {
			st.responseID = ev.Message.ID
			st.anthropicUsage(ev.Message.Usage)
		}
	case "content_block_start":
		if b := ev.ContentBlock; b != nil && b.Type == "tool_use" {
			// The block names the tool: the reply's first token, as a chat stream's first
			// tool_calls delta is. The input comes in input_json_delta pieces; the start's own
			// (empty) input stands only when none comes.
			st.sawContent()
			if st.toolBlock == nil {
				st.toolBlock = map[int]int{}
			}
			st.toolBlock[ev.Index] = len(st.calls)
			st.calls = append(st.calls, ToolCall{ID: b.ID, Name: b.Name})
			st.toolStart = append(st.toolStart, string(b.Input))
		}
	case "content_block_delta":
		if d := ev.Delta; d != nil {
			if d.Text != "" || d.Thinking != "" || d.PartialJSON != "" {
				st.sawContent()
			}
			st.reply.WriteString(d.Text)
			if i, ok := st.toolBlock[ev.Index]; ok && d.Type == "input_json_delta" {
				st.calls[i].Arguments += d.PartialJSON
			}
		}
	case "message_delta":
		st.anthropicUsage(ev.Usage)
	case "message_stop":
		st.done = true
		for i := range st.calls {
			if st.calls[i].Arguments == "" {
				st.calls[i].Arguments = st.toolStart[i]
			}
		}
	case "error":
		if ev.Error != nil {
			return errors.New("error event: " + ev.Error.String())
		}
		return errors.New("error event")
	}
	return nil
}

// anthropicUsage takes the fields u carries. Anthropic's input_tokens leaves out the tokens
// read from or written to the cache, so the prompt is the sum of the three.
func (st *stream) anthropicUsage(u *anthropicUsage) {
	if u == nil {
		return
	}
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set(&st.in, u.InputTokens)
	set(&st.cacheWrite, u.CacheCreationInputTokens)
	set(&st.cached, u.CacheReadInputTokens)
	set(&st.output, u.OutputTokens)
	st.prompt = st.in + st.cacheWrite + st.cached
}
