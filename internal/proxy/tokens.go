package proxy

import (
	"bytes"
	"encoding/json"

	"github.com/cacheroute/cacheroute/internal/chatform"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/tokenize"
)

// tokens.go gives the policy a request's prompt tokens when it wants them (WantsTokens) and the
// workers' KV-cache events are on: package tokenize asks an engine for them; this file turns the
// request's body into what it asks. A chat is asked with its messages and tools as sent. A
// Responses or Messages body is asked as the chat vLLM converts it to (package chatform); one
// that cannot be converted exactly (images, reasoning, built-in tools ...) is not tokenized, and
// routes as without events. A completion is asked with its prompt when it is one string.

// addPromptTokens gives in the request's prompt tokens when they are worth asking for (else it
// leaves in.Tokens nil), with the LoRA adapter they are for ("" for a base model) and the
// request's cache_salt.
func (s *Server) addPromptTokens(rt *route, in *policy.Input, body []byte) {
	if s.opts.Tokenize == nil || rt.tokenAsk == nil || in.Request.Text == "" ||
		len(in.Candidates) == 0 || !s.policy.WantsTokens(*in) {
		return
	}
	salt, ok := cacheSalt(body)
	if !ok {
		return // an engine refuses the request: it routes as without events, and is answered
	}
	in.Tokens, in.LoRA = s.opts.Tokenize.Tokens(rt.path, in.Request.Text, in.Candidates, in.Request.Model, body, rt.tokenAsk)
	if in.Tokens != nil {
		in.CacheSalt = salt
	}
}

// cacheSalt is the body's top-level cache_salt, "" without one; ok is false when it is not a
// string. vLLM folds the salt into a request's first block, so that requests of different salts
// never share cached blocks.
func cacheSalt(body []byte) (salt string, ok bool) {
	if !bytes.Contains(body, []byte(`"cache_salt"`)) {
		return "", true // inside a JSON string the name's quotes would be escaped
	}
	var b struct {
		CacheSalt *string `json:"cache_salt"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		return "", false
	}
	if b.CacheSalt == nil {
		return "", true // the name stood in a nested object
	}
	return *b.CacheSalt, true
}

// tokenAsk turns a route's body into its /tokenize query; ok is false when the body does not
// render exactly as the query says, and is not tokenized.
type tokenAsk func(body []byte) (q tokenize.Query, ok bool)

// chatTokenAsk takes a chat's messages and tools as sent.
func chatTokenAsk(body []byte) (tokenize.Query, bool) {
	var chat struct {
		Messages json.RawMessage `json:"messages"`
		Tools    json.RawMessage `json:"tools,omitempty"`
	}
	if err := json.Unmarshal(body, &chat); err != nil {
		return tokenize.Query{}, false
	}
	return tokenize.Query{Messages: chat.Messages, Tools: chat.Tools}, true
}

// completionTokenAsk takes a completion's prompt when it is one string; a list of prompts (a
// batch) or of token ids is not asked.
func completionTokenAsk(body []byte) (tokenize.Query, bool) {
	var c struct {
		Prompt           json.RawMessage `json:"prompt"`
		AddSpecialTokens *bool           `json:"add_special_tokens"`
	}
	var prompt string
	if json.Unmarshal(body, &c) != nil || json.Unmarshal(c.Prompt, &prompt) != nil {
		return tokenize.Query{}, false
	}
	return tokenize.Query{Prompt: &prompt, AddSpecialTokens: c.AddSpecialTokens}, true
}

// convertedTokenAsk takes the chat that convert renders a Responses or Messages body as
// (chatform), or refuses the body when convert cannot render it exactly.
func convertedTokenAsk(convert func([]byte) (*chatform.Chat, error)) tokenAsk {
	return func(body []byte) (tokenize.Query, bool) {
		chat, err := convert(body)
		if err != nil {
			return tokenize.Query{}, false
		}
		messages, tools, err := chat.Encode()
		return tokenize.Query{Messages: messages, Tools: tools}, err == nil
	}
}
