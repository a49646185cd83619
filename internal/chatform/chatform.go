// Package chatform turns an OpenAI Responses body and an Anthropic Messages body into the chat
// request vLLM renders for them: vLLM serves both APIs by converting them to a chat completion
// request (its Responses serving builds chat messages from the instructions and input items; its
// Messages serving builds a ChatCompletionRequest from the system, messages and tools) and
// rendering that through the model's chat template. A router that sends these messages and tools
// to the engine's POST /tokenize gets the prompt tokens the engine will cache for the request.
//
// The conversion follows vLLM's exactly where it can, and refuses (an error saying why) where it
// cannot, so that a request is never matched against the engines' caches by tokens it will not
// have: images, documents and files (whose tokens the engine computes from the media), thinking
// blocks and reasoning items (passed to templates that may or may not render them), server and
// built-in tools, system messages among a Messages request's messages (which vLLM places by a
// per-model probe), a partial assistant message to continue, chat_template_kwargs, and any type
// the conversion does not know.
//
// Bodies are read as the servers that define them read JSON: keys match exactly, a repeated
// key's last value counts, and null is absence.
package chatform

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/cacheroute/cacheroute/internal/pyjson"
)

// Chat is the messages and tools of a chat request.
type Chat struct {
	Messages []Message `json:"messages"`
	Tools    []Tool    `json:"tools,omitempty"`
}

// Message is one chat message. Content is a JSON string or an array of text parts, or absent
// (an assistant message that only calls tools).
type Message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	ToolCalls  []ToolCall      `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

// ToolCall is a function call of an assistant message.
type ToolCall struct {
	ID       string       `json:"id"`
	Type     string       `json:"type"` // "function"
	Function FunctionCall `json:"function"`
}

// FunctionCall names the function called and its arguments, a JSON text.
type FunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// Tool is a function tool as the chat API spells it.
type Tool struct {
	Type     string   `json:"type"` // "function"
	Function Function `json:"function"`
}

// Function is a function tool's definition: what vLLM's FunctionDefinition keeps.
type Function struct {
	Name        string          `json:"name"`
	Description *string         `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// Encode writes the messages and the tools (nil when there are none) as JSON, without HTML
// escaping, so that a text holding "<" reaches the engine as it was sent.
func (c *Chat) Encode() (messages, tools []byte, err error) {
	if messages, err = encode(c.Messages); err != nil || len(c.Tools) == 0 {
		return messages, nil, err
	}
	tools, err = encode(c.Tools)
	return messages, tools, err
}

func encode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
}

// inexact is the error of a body whose chat rendering cannot be known exactly.
func inexact(format string, args ...any) error {
	return fmt.Errorf("not rendered exactly: "+format, args...)
}

var errShape = errors.New("not rendered exactly: a field of an unexpected JSON type")

// object reads a JSON object's members; ok is false when raw is not an object.
func object(raw json.RawMessage) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, errShape
	}
	return m, nil
}

// absent reports whether a member is missing or null.
func absent(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// str reads an optional string member: "" when absent.
func str(raw json.RawMessage) (string, error) {
	if absent(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", errShape
	}
	return s, nil
}

// array reads an optional array member: nil when absent.
func array(raw json.RawMessage) ([]json.RawMessage, error) {
	if absent(raw) {
		return nil, nil
	}
	var a []json.RawMessage
	if json.Unmarshal(raw, &a) != nil || a == nil {
		return nil, errShape
	}
	return a, nil
}

// isString reports whether raw is a JSON string.
func isString(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '"'
}

// text is a JSON string holding s.
func text(s string) json.RawMessage {
	b, _ := encode(s)
	return b
}

// textPart is a chat text part.
type textPart struct {
	Type string `json:"type"` // "text"
	Text string `json:"text"`
}

// content is a chat content: one text part as a string, more as an array of text parts, as
// vLLM's Messages serving writes it.
func content(parts []string) json.RawMessage {
	if len(parts) == 1 {
		return text(parts[0])
	}
	ps := make([]textPart, len(parts))
	for i, p := range parts {
		ps[i] = textPart{"text", p}
	}
	b, _ := encode(ps)
	return b
}

// parameters reads a tool's JSON schema: an object, or absent.
func parameters(raw json.RawMessage) (json.RawMessage, error) {
	if absent(raw) {
		return nil, nil
	}
	if raw = bytes.TrimSpace(raw); raw[0] != '{' {
		return nil, errShape
	}
	var c bytes.Buffer
	if err := json.Compact(&c, raw); err != nil {
		return nil, errShape
	}
	return c.Bytes(), nil
}

// description reads a tool's optional description.
func description(raw json.RawMessage) (*string, error) {
	if absent(raw) {
		return nil, nil
	}
	s, err := str(raw)
	return &s, err
}

// noToolsWhenNone refuses tools with tool_choice "none": vLLM can be started to leave the tools
// out of the prompt then (--exclude-tools-when-tool-choice-none), which a router cannot see.
func noToolsWhenNone(tools []Tool, none bool) error {
	if len(tools) > 0 && none {
		return inexact("tools with tool_choice none")
	}
	return nil
}

// billingHeader starts the text block Claude Code adds to its system prompt with a hash of the
// request, which vLLM's Messages serving leaves out of the prompt.
const billingHeader = "x-anthropic-billing-header"

// Messages converts an Anthropic Messages body.
func Messages(body []byte) (*Chat, error) {
	b, err := object(body)
	if err != nil {
		return nil, err
	}
	if !absent(b["chat_template_kwargs"]) {
		return nil, inexact("chat_template_kwargs")
	}
	c := &Chat{}
	system, err := messagesSystem(b["system"])
	if err != nil {
		return nil, err
	}
	if system != "" {
		c.Messages = append(c.Messages, Message{Role: "system", Content: text(system)})
	}
	msgs, err := array(b["messages"])
	if err != nil || len(msgs) == 0 {
		return nil, errShape
	}
	for i, raw := range msgs {
		if c.Messages, err = appendAnthropicMessage(c.Messages, raw); err != nil {
			return nil, fmt.Errorf("messages.%d: %w", i, err)
		}
	}
	if c.Tools, err = anthropicTools(b["tools"]); err != nil {
		return nil, err
	}
	none := false
	if !absent(b["tool_choice"]) {
		choice, err := object(b["tool_choice"])
		if err != nil {
			return nil, err
		}
		typ, err := str(choice["type"])
		if err != nil {
			return nil, err
		}
		none = typ == "none"
	}
	return c, noToolsWhenNone(c.Tools, none)
}

// messagesSystem is the system prompt's text: a string, or its text blocks joined, Claude Code's
// billing header left out.
func messagesSystem(raw json.RawMessage) (string, error) {
	if absent(raw) || isString(raw) {
		return str(raw)
	}
	blocks, err := array(raw)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	for _, r := range blocks {
		blk, err := object(r)
		if err != nil {
			return "", err
		}
		typ, err := str(blk["type"])
		if err != nil {
			return "", err
		}
		if typ != "text" {
			return "", inexact("a system block of type %q", typ)
		}
		t, err := str(blk["text"])
		if err != nil {
			return "", err
		}
		if !strings.HasPrefix(t, billingHeader) {
			sb.WriteString(t)
		}
	}
	return sb.String(), nil
}

// appendAnthropicMessage appends the chat messages one Messages message converts to: a user
// message's tool results first, one tool message each, then its text as a user message (none when
// it has no text); an assistant message's text and tool_use blocks as one assistant message.
func appendAnthropicMessage(out []Message, raw json.RawMessage) ([]Message, error) {
	m, err := object(raw)
	if err != nil {
		return nil, err
	}
	role, err := str(m["role"])
	if err != nil {
		return nil, err
	}
	switch role {
	case "user", "assistant":
	case "system":
		return nil, inexact("a system message among the messages")
	default:
		return nil, inexact("role %q", role)
	}
	if isString(m["content"]) {
		s, err := str(m["content"])
		if err != nil {
			return nil, err
		}
		return append(out, Message{Role: role, Content: text(s)}), nil
	}
	blocks, err := array(m["content"])
	if err != nil {
		return nil, err
	}
	var parts []string
	var calls []ToolCall
	for k, r := range blocks {
		blk, err := object(r)
		if err != nil {
			return nil, err
		}
		typ, err := str(blk["type"])
		if err != nil {
			return nil, err
		}
		switch {
		case typ == "text":
			t, err := str(blk["text"])
			if err != nil {
				return nil, err
			}
			if t != "" {
				parts = append(parts, t)
			}
		case typ == "redacted_thinking":
			// opaque, and left out by vLLM
		case typ == "tool_use" && role == "assistant":
			call, err := toolUse(blk)
			if err != nil {
				return nil, fmt.Errorf("content.%d: %w", k, err)
			}
			calls = append(calls, call)
		case typ == "tool_result" && role == "user":
			tm, err := toolResult(blk)
			if err != nil {
				return nil, fmt.Errorf("content.%d: %w", k, err)
			}
			out = append(out, tm)
		default:
			return nil, inexact("a %s block of type %q", role, typ)
		}
	}
	if role == "user" && len(parts) == 0 {
		return out, nil
	}
	msg := Message{Role: role, ToolCalls: calls}
	if len(parts) > 0 {
		msg.Content = content(parts)
	}
	return append(out, msg), nil
}

// toolUse converts a tool_use block: its input becomes the call's arguments as Python's
// json.dumps writes it, which is how vLLM writes them.
func toolUse(blk map[string]json.RawMessage) (ToolCall, error) {
	id, err := str(blk["id"])
	if err != nil {
		return ToolCall{}, err
	}
	if id == "" {
		return ToolCall{}, inexact("a tool_use without id") // vLLM makes one up from the clock
	}
	name, err := str(blk["name"])
	if err != nil {
		return ToolCall{}, err
	}
	args := "{}"
	if in := bytes.TrimSpace(blk["input"]); !absent(in) {
		if in[0] != '{' {
			return ToolCall{}, errShape
		}
		if args, err = pyjson.Dumps(in); err != nil {
			return ToolCall{}, inexact("a tool_use input: %v", err)
		}
	}
	return ToolCall{ID: id, Type: "function", Function: FunctionCall{Name: name, Arguments: args}}, nil
}

// toolResult converts a tool_result block to a tool message: its content a string, or its text
// blocks joined by newlines.
func toolResult(blk map[string]json.RawMessage) (Message, error) {
	id, err := str(blk["tool_use_id"])
	if err != nil {
		return Message{}, err
	}
	if id == "" {
		return Message{}, inexact("a tool_result without tool_use_id")
	}
	var s string
	if absent(blk["content"]) || isString(blk["content"]) {
		if s, err = str(blk["content"]); err != nil {
			return Message{}, err
		}
		return Message{Role: "tool", ToolCallID: id, Content: text(s)}, nil
	}
	items, err := array(blk["content"])
	if err != nil {
		return Message{}, err
	}
	texts := make([]string, 0, len(items))
	for _, r := range items {
		it, err := object(r)
		if err != nil {
			return Message{}, err
		}
		typ, err := str(it["type"])
		if err != nil {
			return Message{}, err
		}
		if typ != "text" {
			return Message{}, inexact("a tool_result block of type %q", typ)
		}
		t, err := str(it["text"])
		if err != nil {
			return Message{}, err
		}
		texts = append(texts, t)
	}
	return Message{Role: "tool", ToolCallID: id, Content: text(strings.Join(texts, "\n"))}, nil
}

// anthropicTools converts client tools ({name, description, input_schema}, no type or type
// custom); a server tool is refused.
func anthropicTools(raw json.RawMessage) ([]Tool, error) {
	return convertTools(raw, "input_schema", func(t map[string]json.RawMessage, typ string) error {
		if typ != "" && typ != "custom" {
			return inexact("a tool of type %q", typ)
		}
		if !absent(t["defer_loading"]) {
			return inexact("a tool with defer_loading")
		}
		return nil
	})
}

// responsesTools converts function tools ({type: function, name, description, parameters});
// any other tool is refused.
func responsesTools(raw json.RawMessage) ([]Tool, error) {
	return convertTools(raw, "parameters", func(_ map[string]json.RawMessage, typ string) error {
		if typ != "function" {
			return inexact("a tool of type %q", typ)
		}
		return nil
	})
}

// convertTools converts a list of tools, each with a name, a description and its JSON schema in
// the member schema, once accept (given the tool and its type) lets it through.
func convertTools(raw json.RawMessage, schema string, accept func(t map[string]json.RawMessage, typ string) error) ([]Tool, error) {
	list, err := array(raw)
	if err != nil {
		return nil, err
	}
	var tools []Tool
	for _, r := range list {
		t, err := object(r)
		if err != nil {
			return nil, err
		}
		typ, err := str(t["type"])
		if err != nil {
			return nil, err
		}
		if err := accept(t, typ); err != nil {
			return nil, err
		}
		fn, err := function(t["name"], t["description"], t[schema])
		if err != nil {
			return nil, err
		}
		tools = append(tools, Tool{Type: "function", Function: fn})
	}
	return tools, nil
}

func function(name, desc, params json.RawMessage) (Function, error) {
	var fn Function
	var err error
	if fn.Name, err = str(name); err != nil {
		return fn, err
	}
	if fn.Name == "" {
		return fn, inexact("a tool without name")
	}
	if fn.Description, err = description(desc); err != nil {
		return fn, err
	}
	fn.Parameters, err = parameters(params)
	return fn, err
}

// Responses converts a Responses body that does not continue a stored response.
func Responses(body []byte) (*Chat, error) {
	b, err := object(body)
	if err != nil {
		return nil, err
	}
	for _, field := range []string{"previous_response_id", "conversation", "prompt", "chat_template_kwargs"} {
		if !absent(b[field]) {
			return nil, inexact("%s", field)
		}
	}
	c := &Chat{}
	instructions, err := str(b["instructions"])
	if err != nil {
		return nil, err
	}
	if instructions != "" {
		c.Messages = append(c.Messages, Message{Role: "system", Content: text(instructions)})
	}
	switch input := b["input"]; {
	case absent(input):
		return nil, errShape
	case isString(input):
		s, err := str(input)
		if err != nil {
			return nil, err
		}
		c.Messages = append(c.Messages, Message{Role: "user", Content: text(s)})
	default:
		items, err := array(input)
		if err != nil {
			return nil, err
		}
		if c.Messages, err = appendItems(c.Messages, items); err != nil {
			return nil, err
		}
	}
	if c.Tools, err = responsesTools(b["tools"]); err != nil {
		return nil, err
	}
	none := false
	if isString(b["tool_choice"]) {
		choice, _ := str(b["tool_choice"])
		none = choice == "none"
	}
	return c, noToolsWhenNone(c.Tools, none)
}

// appendItems appends the chat messages the input items convert to. As in vLLM, a function call
// joins the assistant message just before it (an assistant text, or other calls), and an
// assistant text fills the content of an assistant message of calls only just before it; neither
// reaches back before the input's first item.
func appendItems(out []Message, items []json.RawMessage) ([]Message, error) {
	first := len(out)
	// contentless: the last message is an assistant message without content, from the input.
	contentless := false
	for i, raw := range items {
		it, err := object(raw)
		if err != nil {
			return nil, err
		}
		typ, err := str(it["type"])
		if err != nil {
			return nil, err
		}
		lastAssistant := len(out) > first && out[len(out)-1].Role == "assistant"
		switch typ {
		case "", "message":
			status, err := str(it["status"])
			if err != nil {
				return nil, err
			}
			if i == len(items)-1 && (status == "in_progress" || status == "incomplete") {
				return nil, inexact("a partial last message (continued, not answered)")
			}
			role, err := str(it["role"])
			if err != nil {
				return nil, err
			}
			switch role {
			case "assistant":
				t, err := assistantText(it["content"])
				if err != nil {
					return nil, fmt.Errorf("input.%d: %w", i, err)
				}
				if lastAssistant && contentless {
					out[len(out)-1].Content = text(t)
				} else {
					out = append(out, Message{Role: "assistant", Content: text(t)})
				}
				contentless = false
			case "user", "system", "developer":
				c, err := inputContent(it["content"])
				if err != nil {
					return nil, fmt.Errorf("input.%d: %w", i, err)
				}
				out = append(out, Message{Role: role, Content: c})
				contentless = false
			default:
				return nil, inexact("input.%d: role %q", i, role)
			}
		case "function_call":
			if !absent(it["namespace"]) {
				return nil, inexact("input.%d: a namespaced function call", i)
			}
			var call ToolCall
			call.Type = "function"
			if call.ID, err = str(it["call_id"]); err != nil {
				return nil, err
			}
			if call.Function.Name, err = str(it["name"]); err != nil {
				return nil, err
			}
			if call.Function.Arguments, err = str(it["arguments"]); err != nil {
				return nil, err
			}
			if call.ID == "" || call.Function.Name == "" {
				return nil, errShape
			}
			if lastAssistant {
				last := &out[len(out)-1]
				last.ToolCalls = append(last.ToolCalls, call)
			} else {
				out = append(out, Message{Role: "assistant", ToolCalls: []ToolCall{call}})
				contentless = true
			}
		case "function_call_output":
			id, err := str(it["call_id"])
			if err != nil {
				return nil, err
			}
			if id == "" {
				return nil, errShape
			}
			c, err := inputContent(it["output"])
			if err != nil {
				return nil, fmt.Errorf("input.%d: %w", i, err)
			}
			out = append(out, Message{Role: "tool", ToolCallID: id, Content: c})
			contentless = false
		default:
			return nil, inexact("input.%d: an item of type %q", i, typ)
		}
	}
	return out, nil
}

// assistantText is what vLLM takes of an assistant message's content: a string, or the text of
// its first part.
func assistantText(raw json.RawMessage) (string, error) {
	if absent(raw) || isString(raw) {
		return str(raw)
	}
	parts, err := array(raw)
	if err != nil || len(parts) == 0 {
		return "", err
	}
	p, err := object(parts[0])
	if err != nil {
		return "", err
	}
	typ, err := str(p["type"])
	if err != nil {
		return "", err
	}
	if typ != "output_text" && typ != "input_text" {
		return "", inexact("an assistant content part of type %q", typ)
	}
	return str(p["text"])
}

// inputContent converts a message's content or a function call's output: a string as it is,
// text parts (input_text, output_text) as chat text parts.
func inputContent(raw json.RawMessage) (json.RawMessage, error) {
	if absent(raw) {
		return nil, errShape
	}
	if isString(raw) {
		s, err := str(raw)
		return text(s), err
	}
	list, err := array(raw)
	if err != nil {
		return nil, err
	}
	parts := make([]textPart, 0, len(list))
	for _, r := range list {
		p, err := object(r)
		if err != nil {
			return nil, err
		}
		typ, err := str(p["type"])
		if err != nil {
			return nil, err
		}
		if typ != "input_text" && typ != "output_text" {
			return nil, inexact("a content part of type %q", typ)
		}
		t, err := str(p["text"])
		if err != nil {
			return nil, err
		}
		parts = append(parts, textPart{"text", t})
	}
	return encode(parts)
}
