package bench

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// responsesAPI sends POST /v1/responses. The conversation's leading system messages become
// "instructions", the others input message items; tools become flat function tools. A reply
// that called a tool is resent as its function_call items, and the tool result that follows as
// a function_call_output item.
//
// Without chain, every turn resends the whole conversation with "store": false, as a stateless
// client does. With chain, every turn after the first sends only its own input items and
// "previous_response_id", the id of the session's previous response, with "store": true: only
// the worker that stored that response can continue from it. Instructions and tools are sent
// with every turn in both forms, because a response does not carry its instructions over to the
// next one.
//
// With session ids (header or body mode) "prompt_cache_key" is the session id; header mode adds
// the x-session-id header.
type responsesAPI struct{ chain bool }

// responsesRequest is the body of a Responses turn.
type responsesRequest struct {
	Model              string          `json:"model"`
	Instructions       string          `json:"instructions,omitempty"`
	Input              []any           `json:"input"` // responsesMessage, responsesCall, responsesCallOutput
	Tools              json.RawMessage `json:"tools,omitempty"`
	MaxOutputTokens    int             `json:"max_output_tokens"`
	IgnoreEOS          bool            `json:"ignore_eos,omitempty"`
	Stream             bool            `json:"stream"`
	Store              bool            `json:"store"`
	PreviousResponseID string          `json:"previous_response_id,omitempty"`
	PromptCacheKey     string          `json:"prompt_cache_key,omitempty"`
}

// responsesMessage is an input message item; an assistant reply is resent as the text of the
// server's output.
type responsesMessage struct {
	Type    string `json:"type"` // "message"
	Role    string `json:"role"`
	Content string `json:"content"`
}

// responsesCall is a function_call item: a tool call of the server's output, resent as it came.
type responsesCall struct {
	Type      string `json:"type"` // "function_call"
	CallID    string `json:"call_id"`
	Name      string `json:"name"`
	Arguments string `json:"arguments"`
}

// responsesCallOutput is a function_call_output item: the result of the call named call_id.
type responsesCallOutput struct {
	Type   string `json:"type"` // "function_call_output"
	CallID string `json:"call_id"`
	Output string `json:"output"`
}

// responsesTool is a function tool of the Responses API: the chat tool's function, flattened.
type responsesTool struct {
	Type        string          `json:"type"`
	Name        string          `json:"name"`
	Description string          `json:"description,omitempty"`
	Parameters  json.RawMessage `json:"parameters,omitempty"`
}

// responsesEvent is the part of a Responses stream event the bench reads.
type responsesEvent struct {
	Type  string          `json:"type"`
	Delta json.RawMessage `json:"delta"`
	Item  *struct {
		Type      string `json:"type"`
		CallID    string `json:"call_id"`
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"item"` // response.output_item.added and .done
	Message  string `json:"message"` // "error" events
	Code     string `json:"code"`
	Response *struct {
		ID    string    `json:"id"`
		Error *apiError `json:"error"`
		Usage *struct {
			InputTokens        int `json:"input_tokens"`
			OutputTokens       int `json:"output_tokens"`
			InputTokensDetails *struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"input_tokens_details"`
		} `json:"usage"`
	} `json:"response"`
}

// apiError is the error object of OpenAI and Anthropic error events.
type apiError struct {
	Type    string `json:"type"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

func (e *apiError) String() string {
	kind := e.Code
	if kind == "" {
		kind = e.Type
	}
	if kind == "" {
		return e.Message
	}
	return kind + ": " + e.Message
}

func (responsesAPI) path() string   { return protocol.ResponsesPath }
func (a responsesAPI) chains() bool { return a.chain }
func (responsesAPI) final() string  { return "response.completed" }
func (responsesAPI) tools(chat json.RawMessage) (json.RawMessage, error) {
	return convertTools(chat, func(f *chatFunction) responsesTool {
		return responsesTool{Type: "function", Name: f.Function.Name, Description: f.Function.Description, Parameters: f.Function.Parameters}
	})
}

func (a responsesAPI) body(x *exchange) any {
	instructions, lead := splitSystem(x.msgs)
	from := lead
	if x.previousID != "" {
		from = max(lead, x.fresh)
	}
	r := &responsesRequest{Model: x.model, Instructions: instructions, Input: make([]any, 0, len(x.msgs)-from),
		Tools: x.tools, MaxOutputTokens: x.maxTokens, IgnoreEOS: x.ignoreEOS, Stream: true, Store: a.chain,
		PreviousResponseID: x.previousID, PromptCacheKey: x.sessionID}
	for _, m := range x.msgs[from:] {
		switch {
		case m.Role == "assistant" && len(m.calls) > 0:
			if m.Content != "" {
				r.Input = append(r.Input, responsesMessage{"message", "assistant", m.Content})
			}
			for _, c := range m.calls {
				r.Input = append(r.Input, responsesCall{"function_call", c.ID, c.Name, c.Arguments})
			}
		case m.callID != "":
			r.Input = append(r.Input, responsesCallOutput{"function_call_output", m.callID, m.Content})
		default:
			r.Input = append(r.Input, responsesMessage{"message", responsesRole(m.Role), m.Content})
		}
	}
	return r
}

// responsesRole maps a chat role to a message item's: user, assistant, system and developer
// are kept, anything else (a tool result that answers no call of the conversation) is user
// input.
func responsesRole(role string) string {
	switch role {
	case "user", "assistant", "system", "developer":
		return role
	}
	return "user"
}

func (responsesAPI) header(h http.Header, x *exchange) {
	if x.mode == SessionHeader && x.sessionID != "" {
		h.Set(headerSessionID, x.sessionID)
	}
}

func (responsesAPI) event(data []byte, st *stream) error {
	var ev responsesEvent
	if err := json.Unmarshal(data, &ev); err != nil {
		return err
	}
	switch ev.Type {
	case "response.output_text.delta":
		text := unquote(ev.Delta)
		if text != "" {
			st.sawContent()
		}
		st.reply.WriteString(text)
	case "response.reasoning_text.delta", "response.reasoning_summary_text.delta",
		"response.function_call_arguments.delta", "response.refusal.delta":
		if unquote(ev.Delta) != "" {
			st.sawContent()
		}
	case "response.output_item.added":
		// A function call's item names the function: its first token, as a chat stream's first
		// tool_calls delta is.
		if ev.Item != nil && ev.Item.Type == "function_call" {
			st.sawContent()
		}
	case "response.output_item.done":
		if it := ev.Item; it != nil && it.Type == "function_call" {
			st.calls = append(st.calls, ToolCall{ID: it.CallID, Name: it.Name, Arguments: it.Arguments})
		}
	case "response.completed", "response.incomplete":
		// incomplete is a complete stream too: the answer stopped at max_output_tokens.
		st.done = true
	case "response.failed":
		if ev.Response != nil && ev.Response.Error != nil {
			return errors.New("response.failed: " + ev.Response.Error.String())
		}
		return errors.New("response.failed")
	case "error":
		return fmt.Errorf("error event: %s", (&apiError{Code: ev.Code, Message: ev.Message}).String())
	}
	if r := ev.Response; r != nil {
		if r.ID != "" {
			st.responseID = r.ID
		}
		if u := r.Usage; u != nil {
			st.prompt, st.output = u.InputTokens, u.OutputTokens
			if u.InputTokensDetails != nil {
				st.cached = u.InputTokensDetails.CachedTokens
			}
		}
	}
	return nil
}
