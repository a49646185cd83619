package policy

// Prompt is a request's prompt tokens as the engines render them (their /tokenize), with what
// keys their KV blocks besides the tokens. A policy that matches requests against the workers'
// KV-cache events asks for them (Input.PromptTokens) when the request is worth the round trip.
type Prompt struct {
	// Tokens are the prompt's tokens; nil when they were not to be had: the request is not a
	// chat, Responses or Messages request whose body renders exactly as a chat, nor a completion
	// of one prompt string, or no candidate could tokenize it, or the call failed.
	Tokens []uint32
	// LoRA is the LoRA adapter Tokens were asked for, "" for a base model: the request's own
	// model when the worker that tokenized it lists it as an adapter. Engines compute an
	// adapter's KV blocks apart (vLLM hashes the adapter's name into them), so a policy matches
	// the tokens against the KV-cache events under it: an adapter's blocks never serve the base
	// model or another adapter.
	LoRA string
	// CacheSalt is the request's cache_salt when it came with Tokens, "" for none. vLLM folds it
	// into a request's first block, so a salted request matches only blocks computed with the
	// same salt.
	CacheSalt string
}

// PromptMemo remembers a request's Prompt once a policy asked for it (Input.PromptTokens), so that
// a request Selected again is never tokenized twice. The proxy makes one per request, its zero
// value; it holds a pointer only, so that a request whose tokens nobody asks carries 8 bytes of it.
type PromptMemo struct {
	asked *Prompt // nil until asked
}

// Tokenizer gives a request's prompt tokens as the engine that will serve it renders them, and
// the LoRA adapter they are for ("" for a base model); nil tokens when they are not to be had.
// The router gives one to the policies (Env.Tokenizer) when the workers' KV-cache events are on.
// It reads the request's Path, Request, Model, Candidates and Body.
type Tokenizer interface {
	PromptTokens(in Input) (tokens []uint32, lora string)
}

// Asked is the request's prompt as an earlier PromptTokens of this request found it, or the zero
// Prompt when none asked: Accepted and Done see the tokens Select saw, without asking.
func (in Input) Asked() Prompt {
	if in.Prompt == nil || in.Prompt.asked == nil {
		return Prompt{}
	}
	return *in.Prompt.asked
}

// PromptTokens gives the request's prompt tokens, asking t for them the first time the request
// asks (then remembered in in.Prompt): the cache_salt is read from the body only then, and a
// request whose salt an engine would refuse is not tokenized (it routes as without tokens, and
// is answered by the engine). The zero Prompt when t is nil, or the request has no routing text
// or no candidate.
func (in Input) PromptTokens(t Tokenizer) Prompt {
	if in.Prompt != nil && in.Prompt.asked != nil {
		return *in.Prompt.asked
	}
	var p Prompt
	if req := in.Request; t != nil && req != nil && req.Tokenizes() && req.Text != "" && len(in.Candidates) > 0 {
		if salt, ok := req.CacheSalt(in.Body); ok {
			if p.Tokens, p.LoRA = t.PromptTokens(in); p.Tokens != nil {
				p.CacheSalt = salt
			}
		}
	}
	if in.Prompt != nil {
		asked := p
		in.Prompt.asked = &asked
	}
	return p
}
