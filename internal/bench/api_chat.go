package bench

import (
	"bytes"
	"encoding/json"
	"net/http"

	"github.com/cacheroute/cacheroute/internal/protocol"
)

// chatAPI sends POST /v1/chat/completions with the whole conversation, streamed with
// stream_options.include_usage. The session id goes in x-session-id (header mode) or in
// session_params.session_id (body mode).
type chatAPI struct{}

// chatRequest is the body of a chat turn.
type chatRequest struct {
	Model         string          `json:"model"`
	Messages      []Message       `json:"messages"`
	Tools         json.RawMessage `json:"tools,omitempty"`
	MaxTokens     int             `json:"max_tokens"`
	IgnoreEOS     bool            `json:"ignore_eos,omitempty"`
	Stream        bool            `json:"stream"`
	StreamOptions struct {
		IncludeUsage bool `json:"include_usage"`
	} `json:"stream_options"`
	SessionParams *sessionParams `json:"session_params,omitempty"`
}

type sessionParams struct {
	SessionID string `json:"session_id"`
}

// chatChunk is the part of a chat stream chunk the bench reads.
type chatChunk struct {
	Choices []struct {
		Delta struct {
			Content          string          `json:"content"`
			ReasoningContent string          `json:"reasoning_content"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		Text string `json:"text"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

func (chatAPI) path() string                                        { return protocol.ChatPath }
func (chatAPI) tools(chat json.RawMessage) (json.RawMessage, error) { return chat, nil }
func (chatAPI) chains() bool                                        { return false }
func (chatAPI) final() string                                       { return "[DONE]" }

func (chatAPI) body(x *exchange) any {
	r := &chatRequest{Model: x.model, Messages: messages(x.msgs), Tools: x.tools, MaxTokens: x.maxTokens,
		IgnoreEOS: x.ignoreEOS, Stream: true}
	r.StreamOptions.IncludeUsage = true
	if x.mode == SessionBody && x.sessionID != "" {
		r.SessionParams = &sessionParams{x.sessionID}
	}
	return r
}

func (chatAPI) header(h http.Header, x *exchange) {
	if x.mode == SessionHeader && x.sessionID != "" {
		h.Set(headerSessionID, x.sessionID)
	}
}

func (chatAPI) event(data []byte, st *stream) error {
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		st.done = true
		return nil
	}
	var ch chatChunk
	if err := json.Unmarshal(data, &ch); err != nil {
		return err
	}
	for _, c := range ch.Choices {
		text := c.Delta.Content + c.Text
		if text != "" || c.Delta.ReasoningContent != "" || len(c.Delta.ToolCalls) > 0 && string(c.Delta.ToolCalls) != "null" {
			st.sawContent()
		}
		st.reply.WriteString(text)
	}
	if u := ch.Usage; u != nil {
		st.prompt, st.output = u.PromptTokens, u.CompletionTokens
		if u.PromptTokensDetails != nil {
			st.cached = u.PromptTokensDetails.CachedTokens
		}
	}
	return nil
}
