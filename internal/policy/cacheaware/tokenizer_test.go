package cacheaware

import "github.com/cacheroute/cacheroute/internal/policy"

// tokenizer is the policy's Tokenizer in the tests: it answers every request with the same
// tokens and LoRA adapter, as an engine's /tokenize would, and counts the requests it was asked
// for, so that a test sees which requests the policy asks their tokens for.
type tokenizer struct {
	tokens []uint32
	lora   string
	calls  int
}

func (t *tokenizer) PromptTokens(policy.Input) ([]uint32, string) {
	t.calls++
	return t.tokens, t.lora
}

// withTokens is in as it comes back to the policy after a Select that asked its tokens: its
// per-request memo (Input.Prompt) holds ts, for LoRA adapter lora. Accepted and Done see them
// there, and a Select of it again uses them without asking. An input without its body is given
// one without cache_salt, which is where the salt is read from.
func withTokens(in policy.Input, ts []uint32, lora string) policy.Input {
	if in.Body == nil {
		in.Body = []byte("{}")
	}
	in.Prompt = &policy.PromptMemo{}
	in.PromptTokens(&tokenizer{tokens: ts, lora: lora})
	return in
}
