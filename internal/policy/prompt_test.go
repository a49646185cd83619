package policy_test

import (
	"testing"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/protocol"
)

// countingTokenizer answers every request with the same tokens and adapter, and counts the
// requests it was asked for.
type countingTokenizer struct {
	tokens []uint32
	lora   string
	calls  int
}

func (t *countingTokenizer) PromptTokens(policy.Input) ([]uint32, string) {
	t.calls++
	return t.tokens, t.lora
}

// chatInput is a chat request of body among a fleet of two, with a fresh per-request memo.
func chatInput(t *testing.T, body string) policy.Input {
	t.Helper()
	r, err := protocol.ParseChat(nil, []byte(body))
	if err != nil {
		t.Fatal(err)
	}
	pool := newFleet(t, 2, 1)
	return policy.Input{Request: r, Candidates: pool.All(), All: pool.All(), Body: []byte(body), Prompt: &policy.PromptMemo{}}
}

func TestARequestSelectedAgainIsTokenizedOnce(t *testing.T) {
	in := chatInput(t, `{"model":"m","messages":[{"role":"user","content":"hello"}],"cache_salt":"s1"}`)
	tk := &countingTokenizer{tokens: []uint32{1, 2, 3}, lora: "sql"}
	if got := in.Asked(); got.Tokens != nil {
		t.Fatalf("tokens before any was asked: %v", got.Tokens)
	}
	for range 3 { // a Select, its retry, its Select after a Hold
		got := in.PromptTokens(tk)
		if len(got.Tokens) != 3 || got.LoRA != "sql" || got.CacheSalt != "s1" {
			t.Fatalf("prompt %+v, want the tokenizer's tokens and adapter with the body's cache_salt", got)
		}
	}
	if tk.calls != 1 {
		t.Fatalf("tokenizer asked %d times for one request, want once", tk.calls)
	}
	if got := in.Asked(); len(got.Tokens) != 3 || got.CacheSalt != "s1" {
		t.Fatalf("the memo after asking: %+v", got)
	}
	// Without a memo every call asks.
	in.Prompt = nil
	in.PromptTokens(tk)
	if tk.calls != 2 {
		t.Fatalf("without a memo: %d calls, want 2", tk.calls)
	}
}

func TestARequestWhoseSaltAnEngineRefusesIsNotTokenized(t *testing.T) {
	in := chatInput(t, `{"model":"m","messages":[{"role":"user","content":"hello"}],"cache_salt":7}`)
	tk := &countingTokenizer{tokens: []uint32{1, 2, 3}}
	if got := in.PromptTokens(tk); got.Tokens != nil || tk.calls != 0 {
		t.Fatalf("a numeric cache_salt: %+v after %d calls, want no tokens asked", got, tk.calls)
	}
}

func TestTokensNotHadCarryNoSaltAndAreNotAskedAgain(t *testing.T) {
	in := chatInput(t, `{"model":"m","messages":[{"role":"user","content":"hello"}],"cache_salt":"s1"}`)
	got := in.PromptTokens(&countingTokenizer{})
	if got.Tokens != nil || got.CacheSalt != "" {
		t.Fatalf("no tokens to be had: %+v, want the zero prompt", got)
	}
	if got := in.PromptTokens(nil); got.Tokens != nil {
		t.Fatalf("asked again: %+v", got)
	}
}
