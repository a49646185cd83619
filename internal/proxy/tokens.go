package proxy

import (
	"github.com/cacheroute/cacheroute/internal/policy"
)

// tokens.go gives the policy a request's prompt tokens when it wants them (WantsTokens) and the
// workers' KV-cache events are on: package tokenize asks an engine for them, with the query the
// request renders from its one parse (protocol.Request.TokenizeBody). A chat is asked with its
// messages and tools as sent, a Responses or Messages body as the chat vLLM converts it to; one
// that cannot be converted exactly (images, reasoning, built-in tools ...) is not tokenized, and
// routes as without events. A completion is asked with its prompt when it is one string.

// addPromptTokens gives in the request's prompt tokens when they are worth asking for (else it
// leaves in.Tokens nil), with the LoRA adapter they are for ("" for a base model) and the
// request's cache_salt.
func (s *Server) addPromptTokens(rt *route, in *policy.Input, body []byte) {
	if s.opts.Tokenize == nil || !in.Request.Tokenizes() || in.Request.Text == "" ||
		len(in.Candidates) == 0 || !s.policy.WantsTokens(*in) {
		return
	}
	salt, ok := in.Request.CacheSalt(body)
	if !ok {
		return // an engine refuses the request: it routes as without events, and is answered
	}
	in.Tokens, in.LoRA = s.opts.Tokenize.Tokens(rt.path, in.Request.Text, in.Candidates, in.Request.Model, body, in.Request)
	if in.Tokens != nil {
		in.CacheSalt = salt
	}
}
