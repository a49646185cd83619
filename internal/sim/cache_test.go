package sim

import (
	"fmt"
	"testing"

	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

func TestWorker_SecondIdenticalPromptHitsAllFullBlocks(t *testing.T) {
	w := newWorker(t, testConfig())
	msgs := []msg{{"system", "You are terse."}, {"user", words("q1", 1000)}}
	first := chat(t, w, msgs, 8)
	if got := first.Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Fatalf("first request cached_tokens = %d, want 0", got)
	}
	second := chat(t, w, msgs, 8)
	p := second.Usage.PromptTokens
	want := (p / 16) * 16
	if p%16 == 0 {
		want -= 16 // the last prompt token is always computed
	}
	if got := second.Usage.PromptTokensDetails.CachedTokens; got != want || want == 0 {
		t.Fatalf("second request cached_tokens = %d, want all %d full-block tokens of %d", got, want, p)
	}
}

func TestWorker_NextTurnHitsPromptAndReply(t *testing.T) {
	w := newWorker(t, testConfig())
	turn1 := []msg{{"system", "You are terse."}, {"user", words("q1", 800)}}
	r1 := chat(t, w, turn1, 64)
	reply := r1.Choices[0].Message.Content
	if r1.Usage.CompletionTokens != 64 || prompt.CountTokens(reply) != 64 {
		t.Fatalf("reply has %d completion tokens, %d by the tokenizer, want 64",
			r1.Usage.CompletionTokens, prompt.CountTokens(reply))
	}
	turn2 := append(turn1, msg{"assistant", reply}, msg{"user", "and now the tests"})
	r2 := chat(t, w, turn2, 8)

	// Everything the first turn left behind, prompt and reply with its end
	// marker, must hit.
	stream := r1.Usage.PromptTokens + 64 + prompt.CountTokens(prompt.AssistantEnd)
	want := (stream / 16) * 16
	got := r2.Usage.PromptTokensDetails.CachedTokens
	if got < want {
		t.Fatalf("turn 2 cached_tokens = %d, want at least %d (turn 1 prompt %d + reply)", got, want, r1.Usage.PromptTokens)
	}
	if got <= r1.Usage.PromptTokens {
		t.Fatalf("turn 2 cached_tokens = %d, not beyond turn 1's prompt (%d): the reply was not cached", got, r1.Usage.PromptTokens)
	}
}

func TestWorker_PromptDifferingInFirstTokenHitsNothing(t *testing.T) {
	w := newWorker(t, testConfig())
	text := words("", 1200)
	chat(t, w, []msg{{"user", "A" + text}}, 4)
	r := chat(t, w, []msg{{"user", "B" + text}}, 4)
	if got := r.Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Fatalf("cached_tokens = %d, want 0 for a prompt differing in its first content token", got)
	}
	r = chat(t, w, []msg{{"system", "x"}, {"user", "A" + text}}, 4)
	if got := r.Usage.PromptTokensDetails.CachedTokens; got != 0 {
		t.Fatalf("cached_tokens = %d, want 0 for a prompt with a different first message", got)
	}
}

func TestWorker_EvictsLeastRecentlyUsedConversation(t *testing.T) {
	cfg := testConfig()
	cfg.KVCacheBlocks = 40 // room for about two of the conversations below
	w := newWorker(t, cfg)
	conv := func(name string) []msg { return []msg{{"user", words(name, 1000)}} }
	a, b, c := conv("aaa"), conv("bbb"), conv("ccc")
	chat(t, w, a, 1)
	chat(t, w, b, 1)
	chat(t, w, a, 1) // a is now more recent than b
	chat(t, w, c, 1) // needs room: b goes first
	if r := chat(t, w, a, 1); r.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatal("a was evicted though b was less recently used")
	}
	if r := chat(t, w, b, 1); r.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("b kept %d cached tokens, want it evicted", r.Usage.PromptTokensDetails.CachedTokens)
	}
	if w.Stats().Evictions == 0 {
		t.Fatal("no evictions counted")
	}
}

func TestWorker_CountersEqualSumsOverResponses(t *testing.T) {
	w := newWorker(t, testConfig())
	var prompts, cached, completion int
	base := []msg{{"system", "You are terse."}}
	for turn := range 6 {
		msgs := append(base, msg{"user", words(fmt.Sprint("turn", turn%3), 300+100*turn)})
		r := chat(t, w, msgs, 10)
		prompts += r.Usage.PromptTokens
		cached += r.Usage.PromptTokensDetails.CachedTokens
		completion += r.Usage.CompletionTokens
		if r.Usage.TotalTokens != r.Usage.PromptTokens+r.Usage.CompletionTokens {
			t.Fatalf("total_tokens %d != %d + %d", r.Usage.TotalTokens, r.Usage.PromptTokens, r.Usage.CompletionTokens)
		}
		base = append(msgs, msg{"assistant", r.Choices[0].Message.Content})
	}
	s := w.Stats()
	if s.PromptTokens != int64(prompts) || s.CachedTokens != int64(cached) || s.GenerationTokens != int64(completion) {
		t.Fatalf("stats queries/hits/generation = %d/%d/%d, sums over responses = %d/%d/%d",
			s.PromptTokens, s.CachedTokens, s.GenerationTokens, prompts, cached, completion)
	}
	if cached == 0 {
		t.Fatal("a multi-turn conversation never hit the cache")
	}
	if s.Requests != 6 || s.Completed != 6 || s.PinnedBlocks != 0 || s.Running != 0 {
		t.Fatalf("stats after six sequential requests: %+v", s)
	}
}

func TestWorker_ResetPrefixCache(t *testing.T) {
	w := newWorker(t, testConfig())
	msgs := []msg{{"user", words("r", 600)}}
	chat(t, w, msgs, 4)
	if rec := do(t, w, "POST", "/reset_prefix_cache", ""); rec.Code != 200 {
		t.Fatalf("reset status %d", rec.Code)
	}
	if r := chat(t, w, msgs, 4); r.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("cached_tokens = %d after reset, want 0", r.Usage.PromptTokensDetails.CachedTokens)
	}
}

func TestWorker_OutputIsDeterministic(t *testing.T) {
	msgs := []msg{{"user", "tell me"}}
	a := chat(t, newWorker(t, testConfig()), msgs, 20)
	b := chat(t, newWorker(t, testConfig()), msgs, 20)
	if a.Choices[0].Message.Content != b.Choices[0].Message.Content {
		t.Fatalf("same seed and prompt gave %q and %q", a.Choices[0].Message.Content, b.Choices[0].Message.Content)
	}
	cfg := testConfig()
	cfg.Seed = 7
	c := chat(t, newWorker(t, cfg), msgs, 20)
	if c.Choices[0].Message.Content == a.Choices[0].Message.Content {
		t.Fatal("a different seed gave the same text")
	}
}

func TestVocabularyWordsAreSingleTokens(t *testing.T) {
	for i, word := range vocabulary {
		if n := prompt.CountTokens(word); n != 1 {
			t.Errorf("%q is %d tokens", word, n)
		}
		if n := prompt.CountTokens("\n" + word + spaced[i]); n != 3 {
			t.Errorf("%q after a word is not one token", spaced[i])
		}
	}
}
