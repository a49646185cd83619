package protocol_test

// conversion_reference_test.go is the reference of the conversion of Responses and Messages
// bodies into the chat their /tokenize query asks with (agents.go, responses.go, messages.go):
// the conversion as it was written before it read the body's one parse, decoding the body again
// with encoding/json into maps and converting the values. The conversion must write what this
// reference writes, byte for byte, and refuse what it refuses.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// CFChat is the messages and tools of a chat request.
type CFChat struct {
	CFMessages []CFMessage `json:"messages"`
	Tools      []CFTool    `json:"tools,omitempty"`
}

// CFMessage is one chat message. Content is a JSON string or an array of text parts, or absent
// (an assistant message that only calls tools).
type CFMessage struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content,omitempty"`
	ToolCalls  []CFToolCall    `json:"tool_calls,omitempty"`
	ToolCallID string          `json:"tool_call_id,omitempty"`
}

// CFToolCall is a function call of an assistant message.
type CFToolCall struct {
	ID         string         `json:"id"`
	Type       string         `json:"type"` // "function"
	CFFunction CFFunctionCall `json:"function"`
}

// CFFunctionCall names the function called and its arguments, a JSON text.
type CFFunctionCall struct {
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// CFTool is a function tool as the chat API spells it.
type CFTool struct {
	Type       string     `json:"type"` // "function"
	CFFunction CFFunction `json:"function"`
}

// CFFunction is a function tool's definition: what vLLM's FunctionDefinition keeps.
type CFFunction struct {
	Name        string          `json:"name"`
	Description *string         `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// Encode writes the messages and the tools (nil when there are none) as JSON, without HTML
// escaping, so that a text holding "<" reaches the engine as it was sent.
func (c *CFChat) Encode() (messages, tools []byte, err error) {
	if messages, err = cfEncode(c.CFMessages); err != nil || len(c.Tools) == 0 {
		return messages, nil, err
	}
	tools, err = cfEncode(c.Tools)
	return messages, tools, err
}

func cfEncode(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte{'\n'}), nil
}

// inexact is the error of a body whose chat rendering cannot be known exactly.
func cfInexact(format string, args ...any) error {
	return fmt.Errorf("not rendered exactly: "+format, args...)
}

var cfErrShape = errors.New("not rendered exactly: a field of an unexpected JSON type")

// object reads a JSON object's members; ok is false when raw is not an object.
func cfObject(raw json.RawMessage) (map[string]json.RawMessage, error) {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil || m == nil {
		return nil, cfErrShape
	}
	return m, nil
}

// absent reports whether a member is missing or null.
func cfAbsent(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) == 0 || string(raw) == "null"
}

// str reads an optional string member: "" when absent.
func cfStr(raw json.RawMessage) (string, error) {
	if cfAbsent(raw) {
		return "", nil
	}
	var s string
	if json.Unmarshal(raw, &s) != nil {
		return "", cfErrShape
	}
	return s, nil
}

// array reads an optional array member: nil when absent.
func cfArray(raw json.RawMessage) ([]json.RawMessage, error) {
	if cfAbsent(raw) {
		return nil, nil
	}
	var a []json.RawMessage
	if json.Unmarshal(raw, &a) != nil || a == nil {
		return nil, cfErrShape
	}
	return a, nil
}

// isString reports whether raw is a JSON string.
func cfIsString(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	return len(raw) > 0 && raw[0] == '"'
}

// text is a JSON string holding s.
func cfText(s string) json.RawMessage {
	b, _ := cfEncode(s)
	return b
}

// textPart is a chat text part.
type cfTextPart struct {
	Type string `json:"type"` // "text"
	Text string `json:"text"`
}

// content is a chat content: one text part as a string, more as an array of text parts, as
// vLLM's Messages serving writes it.
func cfContent(parts []string) json.RawMessage {
	if len(parts) == 1 {
		return cfText(parts[0])
	}
	ps := make([]cfTextPart, len(parts))
	for i, p := range parts {
		ps[i] = cfTextPart{"text", p}
	}
	b, _ := cfEncode(ps)
	return b
}

// parameters reads a tool's JSON schema: an object, or absent.
func cfParameters(raw json.RawMessage) (json.RawMessage, error) {
	if cfAbsent(raw) {
		return nil, nil
	}
	if raw = bytes.TrimSpace(raw); raw[0] != '{' {
		return nil, cfErrShape
	}
	var c bytes.Buffer
	if err := json.Compact(&c, raw); err != nil {
		return nil, cfErrShape
	}
	return c.Bytes(), nil
}

// description reads a tool's optional description.
func cfDescription(raw json.RawMessage) (*string, error) {
	if cfAbsent(raw) {
		return nil, nil
	}
	s, err := cfStr(raw)
	return &s, err
}

// noToolsWhenNone refuses tools with tool_choice "none": vLLM can be started to leave the tools
// out of the prompt then (--exclude-tools-when-tool-choice-none), which a router cannot see.
func cfNoToolsWhenNone(tools []CFTool, none bool) error {
	if len(tools) > 0 && none {
		return cfInexact("tools with tool_choice none")
	}
	return nil
}

// billingHeader starts the text block Claude Code adds to its system prompt with a hash of the
// request, which vLLM's Messages serving leaves out of the prompt.
const cfBillingHeader = "x-anthropic-billing-header"

// CFMessages converts an Anthropic Messages body.
func CFMessages(body []byte) (*CFChat, error) {
	b, err := cfObject(body)
	if err != nil {
		return nil, err
	}
	if !cfAbsent(b["chat_template_kwargs"]) {
		return nil, cfInexact("chat_template_kwargs")
	}
	c := &CFChat{}
	system, err := cfMessagesSystem(b["system"])
	if err != nil {
		return nil, err
	}
	if system != "" {
		c.CFMessages = append(c.CFMessages, CFMessage{Role: "system", Content: cfText(system)})
	}
	msgs, err := cfArray(b["messages"])
	if err != nil || len(msgs) == 0 {
		return nil, cfErrShape
	}
	for i, raw := range msgs {
		if c.CFMessages, err = cfAppendAnthropicMessage(c.CFMessages, raw); err != nil {
			return nil, fmt.Errorf("messages.%d: %w", i, err)
		}
	}
	if c.Tools, err = cfAnthropicTools(b["tools"]); err != nil {
		return nil, err
	}
	none := false
	if !cfAbsent(b["tool_choice"]) {
		choice, err := cfObject(b["tool_choice"])
		if err != nil {
			return nil, err
		}
		typ, err := cfStr(choice["type"])
		if err != nil {
			return nil, err
		}
		none = typ == "none"
	}
	return c, cfNoToolsWhenNone(c.Tools, none)
}

// messagesSystem is the system prompt's text: a string, or its text blocks joined, Claude Code's
// billing header left out.
func cfMessagesSystem(raw json.RawMessage) (string, error) {
	if cfAbsent(raw) || cfIsString(raw) {
		return cfStr(raw)
	}
	blocks, err := cfArray(raw)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	for _, r := range blocks {
		blk, err := cfObject(r)
		if err != nil {
			return "", err
		}
		typ, err := cfStr(blk["type"])
		if err != nil {
			return "", err
		}
		if typ != "text" {
			return "", cfInexact("a system block of type %q", typ)
		}
		t, err := cfStr(blk["text"])
		if err != nil {
			return "", err
		}
		if !strings.HasPrefix(t, cfBillingHeader) {
			sb.WriteString(t)
		}
	}
	return sb.String(), nil
}

// appendAnthropicMessage appends the chat messages one Messages message converts to: a user
// message's tool results first, one tool message each, then its text as a user message (none when
// it has no text); an assistant message's text and tool_use blocks as one assistant message.
func cfAppendAnthropicMessage(out []CFMessage, raw json.RawMessage) ([]CFMessage, error) {
	m, err := cfObject(raw)
	if err != nil {
		return nil, err
	}
	role, err := cfStr(m["role"])
	if err != nil {
		return nil, err
	}
	switch role {
	case "user", "assistant":
	case "system":
		return nil, cfInexact("a system message among the messages")
	default:
		return nil, cfInexact("role %q", role)
	}
	if cfIsString(m["content"]) {
		s, err := cfStr(m["content"])
		if err != nil {
			return nil, err
		}
		return append(out, CFMessage{Role: role, Content: cfText(s)}), nil
	}
	blocks, err := cfArray(m["content"])
	if err != nil {
		return nil, err
	}
	var parts []string
	var calls []CFToolCall
	for k, r := range blocks {
		blk, err := cfObject(r)
		if err != nil {
			return nil, err
		}
		typ, err := cfStr(blk["type"])
		if err != nil {
			return nil, err
		}
		switch {
		case typ == "text":
			t, err := cfStr(blk["text"])
			if err != nil {
				return nil, err
			}
			if t != "" {
				parts = append(parts, t)
			}
		case typ == "redacted_thinking":
			// opaque, and left out by vLLM
		case typ == "tool_use" && role == "assistant":
			call, err := cfToolUse(blk)
			if err != nil {
				return nil, fmt.Errorf("content.%d: %w", k, err)
			}
			calls = append(calls, call)
		case typ == "tool_result" && role == "user":
			tm, err := cfToolResult(blk)
			if err != nil {
				return nil, fmt.Errorf("content.%d: %w", k, err)
			}
			out = append(out, tm)
		default:
			return nil, cfInexact("a %s block of type %q", role, typ)
		}
	}
	if role == "user" && len(parts) == 0 {
		return out, nil
	}
	msg := CFMessage{Role: role, ToolCalls: calls}
	if len(parts) > 0 {
		msg.Content = cfContent(parts)
	}
	return append(out, msg), nil
}

// toolUse converts a tool_use block: its input becomes the call's arguments as Python's
// json.dumps writes it, which is how vLLM writes them.
func cfToolUse(blk map[string]json.RawMessage) (CFToolCall, error) {
	id, err := cfStr(blk["id"])
	if err != nil {
		return CFToolCall{}, err
	}
	if id == "" {
		return CFToolCall{}, cfInexact("a tool_use without id") // vLLM makes one up from the clock
	}
	name, err := cfStr(blk["name"])
	if err != nil {
		return CFToolCall{}, err
	}
	args := "{}"
	if in := bytes.TrimSpace(blk["input"]); !cfAbsent(in) {
		if in[0] != '{' {
			return CFToolCall{}, cfErrShape
		}
		if args, err = protocol.PythonJSON(in); err != nil {
			return CFToolCall{}, cfInexact("a tool_use input: %v", err)
		}
	}
	return CFToolCall{ID: id, Type: "function", CFFunction: CFFunctionCall{Name: name, Arguments: args}}, nil
}

// toolResult converts a tool_result block to a tool message: its content a string, or its text
// blocks joined by newlines.
func cfToolResult(blk map[string]json.RawMessage) (CFMessage, error) {
	id, err := cfStr(blk["tool_use_id"])
	if err != nil {
		return CFMessage{}, err
	}
	if id == "" {
		return CFMessage{}, cfInexact("a tool_result without tool_use_id")
	}
	var s string
	if cfAbsent(blk["content"]) || cfIsString(blk["content"]) {
		if s, err = cfStr(blk["content"]); err != nil {
			return CFMessage{}, err
		}
		return CFMessage{Role: "tool", ToolCallID: id, Content: cfText(s)}, nil
	}
	items, err := cfArray(blk["content"])
	if err != nil {
		return CFMessage{}, err
	}
	texts := make([]string, 0, len(items))
	for _, r := range items {
		it, err := cfObject(r)
		if err != nil {
			return CFMessage{}, err
		}
		typ, err := cfStr(it["type"])
		if err != nil {
			return CFMessage{}, err
		}
		if typ != "text" {
			return CFMessage{}, cfInexact("a tool_result block of type %q", typ)
		}
		t, err := cfStr(it["text"])
		if err != nil {
			return CFMessage{}, err
		}
		texts = append(texts, t)
	}
	return CFMessage{Role: "tool", ToolCallID: id, Content: cfText(strings.Join(texts, "\n"))}, nil
}

// anthropicTools converts client tools ({name, description, input_schema}, no type or type
// custom); a server tool is refused.
func cfAnthropicTools(raw json.RawMessage) ([]CFTool, error) {
	return cfConvertTools(raw, "input_schema", func(t map[string]json.RawMessage, typ string) error {
		if typ != "" && typ != "custom" {
			return cfInexact("a tool of type %q", typ)
		}
		if !cfAbsent(t["defer_loading"]) {
			return cfInexact("a tool with defer_loading")
		}
		return nil
	})
}

// responsesTools converts function tools ({type: function, name, description, parameters});
// any other tool is refused.
func cfResponsesTools(raw json.RawMessage) ([]CFTool, error) {
	return cfConvertTools(raw, "parameters", func(_ map[string]json.RawMessage, typ string) error {
		if typ != "function" {
			return cfInexact("a tool of type %q", typ)
		}
		return nil
	})
}

// convertTools converts a list of tools, each with a name, a description and its JSON schema in
// the member schema, once accept (given the tool and its type) lets it through.
func cfConvertTools(raw json.RawMessage, schema string, accept func(t map[string]json.RawMessage, typ string) error) ([]CFTool, error) {
	list, err := cfArray(raw)
	if err != nil {
		return nil, err
	}
	var tools []CFTool
	for _, r := range list {
		t, err := cfObject(r)
		if err != nil {
			return nil, err
		}
		typ, err := cfStr(t["type"])
		if err != nil {
			return nil, err
		}
		if err := accept(t, typ); err != nil {
			return nil, err
		}
		fn, err := cfFunction(t["name"], t["description"], t[schema])
		if err != nil {
			return nil, err
		}
		tools = append(tools, CFTool{Type: "function", CFFunction: fn})
	}
	return tools, nil
}

func cfFunction(name, desc, params json.RawMessage) (CFFunction, error) {
	var fn CFFunction
	var err error
	if fn.Name, err = cfStr(name); err != nil {
		return fn, err
	}
	if fn.Name == "" {
		return fn, cfInexact("a tool without name")
	}
	if fn.Description, err = cfDescription(desc); err != nil {
		return fn, err
	}
	fn.Parameters, err = cfParameters(params)
	return fn, err
}

// CFResponses converts a Responses body that does not continue a stored response.
func CFResponses(body []byte) (*CFChat, error) {
	b, err := cfObject(body)
	if err != nil {
		return nil, err
	}
	for _, field := range []string{"previous_response_id", "conversation", "prompt", "chat_template_kwargs"} {
		if !cfAbsent(b[field]) {
			return nil, cfInexact("%s", field)
		}
	}
	c := &CFChat{}
	instructions, err := cfStr(b["instructions"])
	if err != nil {
		return nil, err
	}
	if instructions != "" {
		c.CFMessages = append(c.CFMessages, CFMessage{Role: "system", Content: cfText(instructions)})
	}
	switch input := b["input"]; {
	case cfAbsent(input):
		return nil, cfErrShape
	case cfIsString(input):
		s, err := cfStr(input)
		if err != nil {
			return nil, err
		}
		c.CFMessages = append(c.CFMessages, CFMessage{Role: "user", Content: cfText(s)})
	default:
		items, err := cfArray(input)
		if err != nil {
			return nil, err
		}
		if c.CFMessages, err = cfAppendItems(c.CFMessages, items); err != nil {
			return nil, err
		}
	}
	if c.Tools, err = cfResponsesTools(b["tools"]); err != nil {
		return nil, err
	}
	none := false
	if cfIsString(b["tool_choice"]) {
		choice, _ := cfStr(b["tool_choice"])
		none = choice == "none"
	}
	return c, cfNoToolsWhenNone(c.Tools, none)
}

// appendItems appends the chat messages the input items convert to. As in vLLM, a function call
// joins the assistant message just before it (an assistant text, or other calls), and an
// assistant text fills the content of an assistant message of calls only just before it; neither
// reaches back before the input's first item.
func cfAppendItems(out []CFMessage, items []json.RawMessage) ([]CFMessage, error) {
	first := len(out)
	// contentless: the last message is an assistant message without content, from the input.
	contentless := false
	for i, raw := range items {
		it, err := cfObject(raw)
		if err != nil {
			return nil, err
		}
		typ, err := cfStr(it["type"])
		if err != nil {
			return nil, err
		}
		lastAssistant := len(out) > first && out[len(out)-1].Role == "assistant"
		switch typ {
		case "", "message":
			status, err := cfStr(it["status"])
			if err != nil {
				return nil, err
			}
			if i == len(items)-1 && (status == "in_progress" || status == "incomplete") {
				return nil, cfInexact("a partial last message (continued, not answered)")
			}
			role, err := cfStr(it["role"])
			if err != nil {
				return nil, err
			}
			switch role {
			case "assistant":
				t, err := cfAssistantText(it["content"])
				if err != nil {
					return nil, fmt.Errorf("input.%d: %w", i, err)
				}
				if lastAssistant && contentless {
					out[len(out)-1].Content = cfText(t)
				} else {
					out = append(out, CFMessage{Role: "assistant", Content: cfText(t)})
				}
				contentless = false
			case "user", "system", "developer":
				c, err := cfInputContent(it["content"])
				if err != nil {
					return nil, fmt.Errorf("input.%d: %w", i, err)
				}
				out = append(out, CFMessage{Role: role, Content: c})
				contentless = false
			default:
				return nil, cfInexact("input.%d: role %q", i, role)
			}
		case "function_call":
			if !cfAbsent(it["namespace"]) {
				return nil, cfInexact("input.%d: a namespaced function call", i)
			}
			var call CFToolCall
			call.Type = "function"
			if call.ID, err = cfStr(it["call_id"]); err != nil {
				return nil, err
			}
			if call.CFFunction.Name, err = cfStr(it["name"]); err != nil {
				return nil, err
			}
			if call.CFFunction.Arguments, err = cfStr(it["arguments"]); err != nil {
				return nil, err
			}
			if call.ID == "" || call.CFFunction.Name == "" {
				return nil, cfErrShape
			}
			if lastAssistant {
				last := &out[len(out)-1]
				last.ToolCalls = append(last.ToolCalls, call)
			} else {
				out = append(out, CFMessage{Role: "assistant", ToolCalls: []CFToolCall{call}})
				contentless = true
			}
		case "function_call_output":
			id, err := cfStr(it["call_id"])
			if err != nil {
				return nil, err
			}
			if id == "" {
				return nil, cfErrShape
			}
			c, err := cfInputContent(it["output"])
			if err != nil {
				return nil, fmt.Errorf("input.%d: %w", i, err)
			}
			out = append(out, CFMessage{Role: "tool", ToolCallID: id, Content: c})
			contentless = false
		default:
			return nil, cfInexact("input.%d: an item of type %q", i, typ)
		}
	}
	return out, nil
}

// assistantText is what vLLM takes of an assistant message's content: a string, or the text of
// its first part.
func cfAssistantText(raw json.RawMessage) (string, error) {
	if cfAbsent(raw) || cfIsString(raw) {
		return cfStr(raw)
	}
	parts, err := cfArray(raw)
	if err != nil || len(parts) == 0 {
		return "", err
	}
	p, err := cfObject(parts[0])
	if err != nil {
		return "", err
	}
	typ, err := cfStr(p["type"])
	if err != nil {
		return "", err
	}
	if typ != "output_text" && typ != "input_text" {
		return "", cfInexact("an assistant content part of type %q", typ)
	}
	return cfStr(p["text"])
}

// inputContent converts a message's content or a function call's output: a string as it is,
// text parts (input_text, output_text) as chat text parts.
func cfInputContent(raw json.RawMessage) (json.RawMessage, error) {
	if cfAbsent(raw) {
		return nil, cfErrShape
	}
	if cfIsString(raw) {
		s, err := cfStr(raw)
		return cfText(s), err
	}
	list, err := cfArray(raw)
	if err != nil {
		return nil, err
	}
	parts := make([]cfTextPart, 0, len(list))
	for _, r := range list {
		p, err := cfObject(r)
		if err != nil {
			return nil, err
		}
		typ, err := cfStr(p["type"])
		if err != nil {
			return nil, err
		}
		if typ != "input_text" && typ != "output_text" {
			return nil, cfInexact("a content part of type %q", typ)
		}
		t, err := cfStr(p["text"])
		if err != nil {
			return nil, err
		}
		parts = append(parts, cfTextPart{"text", t})
	}
	return cfEncode(parts)
}
