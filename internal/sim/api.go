package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// Request and response shapes of the OpenAI-compatible API as vLLM serves it.
// Only the fields the simulator acts on are decoded; the rest are ignored.

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type chatRequest struct {
	Model               string          `json:"model"`
	Messages            *[]chatMessage  `json:"messages"`
	Tools               json.RawMessage `json:"tools"`
	ToolChoice          json.RawMessage `json:"tool_choice"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	Stream              bool            `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	KVTransferParams    json.RawMessage `json:"kv_transfer_params"`
}

type chatMessage struct {
	Role      string          `json:"role"`
	Content   json.RawMessage `json:"content"`
	ToolCalls []struct {
		Function struct {
			Name      string `json:"name"`
			Arguments string `json:"arguments"`
		} `json:"function"`
	} `json:"tool_calls"`
}

type contentPart struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	ImageURL *struct {
		URL string `json:"url"`
	} `json:"image_url"`
}

type completionRequest struct {
	Model            string          `json:"model"`
	Prompt           json.RawMessage `json:"prompt"`
	MaxTokens        *int            `json:"max_tokens"`
	IgnoreEOS        bool            `json:"ignore_eos"`
	Stream           bool            `json:"stream"`
	StreamOptions    *streamOptions  `json:"stream_options"`
	KVTransferParams json.RawMessage `json:"kv_transfer_params"`
}

type embeddingRequest struct {
	Model string          `json:"model"`
	Input json.RawMessage `json:"input"`
}

func (r *chatRequest) modelName() string       { return r.Model }
func (r *completionRequest) modelName() string { return r.Model }
func (r *embeddingRequest) modelName() string  { return r.Model }

// badRequest is a client error reported as a vLLM 400.
type badRequest struct{ msg string }

func (e *badRequest) Error() string { return e.msg }

func badf(format string, args ...any) error {
	return &badRequest{msg: fmt.Sprintf(format, args...)}
}

// decodeJSON decodes body into v, turning every decoding failure into a
// badRequest with a message that says what was wrong.
func decodeJSON(body []byte, v any) error {
	err := json.Unmarshal(body, v)
	if err == nil {
		return nil
	}
	var syn *json.SyntaxError
	var typ *json.UnmarshalTypeError
	switch {
	case errors.As(err, &syn):
		return badf("JSON decode error: %v", err)
	case errors.As(err, &typ):
		field := typ.Field
		if field == "" {
			field = "body"
		}
		return badf("%s: expected %s, got JSON %s", field, typ.Type, typ.Value)
	default:
		return badf("JSON decode error: %v", err)
	}
}

// messages turns the request's messages into template messages.
func (r *chatRequest) messages() ([]prompt.Message, error) {
	if r.Messages == nil {
		return nil, badf("messages: field required")
	}
	in := *r.Messages
	if len(in) == 0 {
		return nil, badf("messages: at least one message is required")
	}
	out := make([]prompt.Message, len(in))
	for i := range in {
		m := &in[i]
		if m.Role == "" {
			return nil, badf("messages[%d].role: field required", i)
		}
		content, err := contentText(m.Content)
		if err != nil {
			return nil, badf("messages[%d].content: %v", i, err)
		}
		out[i] = prompt.Message{Role: m.Role, Content: content}
		for _, tc := range m.ToolCalls {
			out[i].ToolCalls = append(out[i].ToolCalls, prompt.ToolCall{Name: tc.Function.Name, Arguments: tc.Function.Arguments})
		}
	}
	return out, nil
}

// contentText reduces a message content (absent, null, a string or an array
// of parts) to text. Text parts are concatenated; an image part renders as
// "<|image|>" followed by its URL.
func contentText(raw json.RawMessage) (string, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	switch raw[0] {
	case '"':
		// The body was validated as a whole already; a string without
		// escapes is its own value, which spares a second scan of what is
		// usually the bulk of the request.
		if inner := raw[1 : len(raw)-1]; bytes.IndexByte(inner, '\\') < 0 && utf8.Valid(inner) {
			return string(inner), nil
		}
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return "", err
		}
		return s, nil
	case '[':
		var parts []contentPart
		if err := json.Unmarshal(raw, &parts); err != nil {
			return "", errors.New("expected an array of content parts")
		}
		var b strings.Builder
		for _, p := range parts {
			switch p.Type {
			case "text":
				b.WriteString(p.Text)
			case "image_url":
				b.WriteString("<|image|>")
				if p.ImageURL != nil {
					b.WriteString(p.ImageURL.URL)
				}
			default:
				return "", fmt.Errorf("unsupported content part type %q", p.Type)
			}
		}
		return b.String(), nil
	default:
		return "", errors.New("expected a string or an array of content parts")
	}
}

// textOrList reads a content field of the Messages or Responses API (absent, null, a string or
// a list of blocks or parts): a list it decodes into elems with list true; anything else it
// reduces to text as a chat content (contentText). what names the list's elements ("blocks",
// "parts") in the error a malformed list gets.
func textOrList[T any](raw json.RawMessage, what string) (text string, elems []T, list bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || raw[0] != '[' {
		text, err = contentText(raw)
		return text, nil, false, err
	}
	if err := json.Unmarshal(raw, &elems); err != nil {
		return "", nil, true, errors.New("expected a string or a list of content " + what)
	}
	return "", elems, true, nil
}

// toolsJSON returns the request's tools as compact JSON, or nil.
func toolsJSON(raw json.RawMessage) ([]byte, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	if raw[0] != '[' {
		return nil, badf("tools: expected an array")
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, badf("tools: %v", err)
	}
	return b.Bytes(), nil
}

// chatToolSpecs reads the function tools of a chat request's tools array
// ([{type:function, function:{name, parameters}}]) for the tool-call rule;
// tools of other types are skipped.
func chatToolSpecs(raw json.RawMessage) ([]toolSpec, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	var tools []protocol.ChatTool
	if err := json.Unmarshal(raw, &tools); err != nil {
		return nil, badf("tools: expected a list of tools")
	}
	var specs []toolSpec
	for i, t := range tools {
		if t.Type != "function" {
			continue
		}
		if t.Function.Name == "" {
			return nil, badf("tools[%d].function.name: field required", i)
		}
		specs = append(specs, toolSpec{Name: t.Function.Name, Parameters: t.Function.Parameters})
	}
	return specs, nil
}

// chatToolChoice reads a chat request's tool_choice: "auto", "none",
// "required", or an object naming a function
// ({"type":"function","function":{"name":...}}); another object, such as
// allowed_tools, leaves the pick to the rule. explicit reports whether the
// request set one at all (absent and null do not): only then does the
// tool-call rule apply to chat.
func chatToolChoice(raw json.RawMessage) (choice toolChoice, explicit bool, err error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return toolChoice{}, false, nil
	}
	var mode string
	if json.Unmarshal(raw, &mode) == nil {
		switch mode {
		case "auto":
			return toolChoice{}, true, nil
		case "required":
			return toolChoice{required: true}, true, nil
		case "none":
			return toolChoice{none: true}, true, nil
		}
		return toolChoice{}, false, badf("tool_choice: expected auto, none, required or an object, got %q", mode)
	}
	var named struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return toolChoice{}, false, badf("tool_choice: expected auto, none, required or an object")
	}
	return toolChoice{name: named.Function.Name}, true, nil
}

// completionPrompt is one prompt of a completion request: text, or token ids.
type completionPrompt struct {
	text  string
	ids   []int64
	isIDs bool
}

// completionPrompts decodes the prompt field: a string, a list of strings, a
// list of token ids, or a list of token-id lists.
func completionPrompts(raw json.RawMessage) ([]completionPrompt, error) {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 || string(raw) == "null" {
		return nil, badf("prompt: field required")
	}
	switch raw[0] {
	case '"':
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return nil, badf("prompt: %v", err)
		}
		return []completionPrompt{{text: s}}, nil
	case '[':
	default:
		return nil, badf("prompt: expected a string, a list of strings or a list of token ids")
	}
	var items []json.RawMessage
	if err := json.Unmarshal(raw, &items); err != nil {
		return nil, badf("prompt: %v", err)
	}
	if len(items) == 0 {
		return nil, badf("prompt: must not be empty")
	}
	switch items[0][0] {
	case '"':
		var ss []string
		if err := json.Unmarshal(raw, &ss); err != nil {
			return nil, badf("prompt: a list must hold only strings or only token ids")
		}
		out := make([]completionPrompt, len(ss))
		for i, s := range ss {
			out[i] = completionPrompt{text: s}
		}
		return out, nil
	case '[':
		var lists [][]int64
		if err := json.Unmarshal(raw, &lists); err != nil {
			return nil, badf("prompt: expected lists of integer token ids")
		}
		out := make([]completionPrompt, len(lists))
		for i, ids := range lists {
			if len(ids) == 0 {
				return nil, badf("prompt[%d]: must not be empty", i)
			}
			out[i] = completionPrompt{ids: ids, isIDs: true}
		}
		return out, nil
	default:
		var ids []int64
		if err := json.Unmarshal(raw, &ids); err != nil {
			return nil, badf("prompt: expected a list of integer token ids")
		}
		return []completionPrompt{{ids: ids, isIDs: true}}, nil
	}
}

// Response shapes.

type usage struct {
	PromptTokens        int                 `json:"prompt_tokens"`
	TotalTokens         int                 `json:"total_tokens"`
	CompletionTokens    int                 `json:"completion_tokens"`
	PromptTokensDetails *promptTokenDetails `json:"prompt_tokens_details"`
}

type promptTokenDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

func (u *usage) add(r Result) {
	u.PromptTokens += r.PromptTokens
	u.CompletionTokens += r.CompletionTokens
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	if u.PromptTokensDetails == nil {
		u.PromptTokensDetails = &promptTokenDetails{}
	}
	u.PromptTokensDetails.CachedTokens += r.CachedTokens + r.TransferredTokens
}

// response is the body of a chat or completions answer that is not streamed: the envelope both
// share around their choices, C (chatChoice or completionChoice).
type response[C any] struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	Created int64  `json:"created"`
	Model   string `json:"model"`
	Choices []C    `json:"choices"`
	Usage   usage  `json:"usage"`
	// KVTransferParams answers a prefill leg (pd.go).
	KVTransferParams *kvTransferParams `json:"kv_transfer_params,omitempty"`
}

type chatChoice struct {
	Index   int `json:"index"`
	Message struct {
		Role string `json:"role"`
		// Content is null when the reply calls a tool.
		Content   *string        `json:"content"`
		ToolCalls []chatToolCall `json:"tool_calls"`
	} `json:"message"`
	Logprobs     any    `json:"logprobs"`
	FinishReason string `json:"finish_reason"`
	StopReason   any    `json:"stop_reason"`
}

// chatToolCall is a tool call of a chat reply, in OpenAI's shape.
type chatToolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"` // "function"
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type completionChoice struct {
	Index        int    `json:"index"`
	Text         string `json:"text"`
	Logprobs     any    `json:"logprobs"`
	FinishReason string `json:"finish_reason"`
	StopReason   any    `json:"stop_reason"`
}

// errorInfo is the inner object of OpenAI's nested error shape.
type errorInfo struct {
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    int    `json:"code"`
}

type errorBody struct {
	Object  string `json:"object"`
	Message string `json:"message"`
	Type    string `json:"type"`
	Param   any    `json:"param"`
	Code    int    `json:"code"`
}
