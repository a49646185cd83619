package router

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/sim"
)

type chatReply struct {
	Choices []struct {
		Message struct{ Role, Content string } `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
}

// cacheAwareOverSims is a cache_aware router over n simulated workers that answer at once, all
// stopped when the test ends.
func cacheAwareOverSims(t *testing.T, n int) *testRouter {
	t.Helper()
	simCfg := instantSim()
	fleet := startSimFleetOf(t, n, simCfg)
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	tr := startRouter(t, cfg)
	for _, u := range fleet.URLs() {
		if err := tr.AddWorker(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
	return tr
}

// Eight agent sessions of four turns each through a cache_aware router to three simulated workers:
// every turn of a session lands on one worker, by session match from turn 2 on, and that worker's
// prefix cache serves at least the previous turn's whole prompt.
func TestCacheAwareKeepsSessionsOnTheirWorkersCache(t *testing.T) {
	tr := cacheAwareOverSims(t, 3)
	system := strings.Repeat("You are a coding agent working in a large repository. ", 20)
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	for s := range 8 {
		history := []msg{{"system", system}, {"user", fmt.Sprintf("Session %d: refactor module %d and keep the tests green.", s, s)}}
		home, prevPrompt := "", 0
		for turn := 1; turn <= 4; turn++ {
			body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": history, "max_tokens": 24})
			resp := tr.post(t, "/v1/chat/completions", string(body), "x-session-id", fmt.Sprintf("agent-%d", s))
			raw := readAll(t, resp)
			if resp.StatusCode != 200 {
				t.Fatalf("session %d turn %d: %d %s", s, turn, resp.StatusCode, raw)
			}
			var reply chatReply
			if err := json.Unmarshal([]byte(raw), &reply); err != nil || len(reply.Choices) == 0 {
				t.Fatalf("session %d turn %d: bad reply %s", s, turn, raw)
			}
			worker, decision := resp.Header.Get(proxy.HeaderWorker), resp.Header.Get(proxy.HeaderDecision)
			if turn == 1 {
				home = worker
			} else {
				if worker != home || decision != "session_id_match" {
					t.Fatalf("session %d turn %d: %s on %s, want session_id_match on %s", s, turn, decision, worker, home)
				}
				block := sim.DefaultConfig().BlockSize
				if cached := reply.Usage.PromptTokensDetails.CachedTokens; cached < prevPrompt/block*block {
					t.Fatalf("session %d turn %d: %d cached tokens, previous prompt was %d tokens", s, turn, cached, prevPrompt)
				}
			}
			prevPrompt = reply.Usage.PromptTokens
			history = append(history, msg{"assistant", reply.Choices[0].Message.Content},
				msg{"user", fmt.Sprintf("Turn %d: the tool printed %d lines; continue.", turn, turn*17)})
		}
	}
	var sum float64
	for _, label := range []string{"session_id_match", "full_history_match", "full_history_low_match", "empty_history_min_load", "load_balance", "stale_tenant_fallback"} {
		sum += counterValue(t, tr, label)
	}
	if sum != 32 || counterValue(t, tr, "session_id_match") != 24 {
		t.Fatalf("decision counters: %v in all, %v session matches; want 32 and 24", sum, counterValue(t, tr, "session_id_match"))
	}
}

func counterValue(t *testing.T, tr *testRouter, label string) float64 {
	t.Helper()
	m, err := tr.Metrics().CacheAwareDecisions.GetMetricWithLabelValues(label)
	if err != nil {
		t.Fatal(err)
	}
	return testutil.ToFloat64(m)
}

// sharedDocument is about 3,000 words of prose that does not repeat: a shared context (a file, a
// RAG passage, a long preamble) that chats send at the start of their one user message.
func sharedDocument() string {
	subjects := []string{"The router", "Each worker", "The prefix cache", "A long session", "The scheduler", "The fleet"}
	verbs := []string{"keeps", "evicts", "serves", "prefills", "shares", "counts"}
	objects := []string{"the blocks of turn", "the tokens of request", "the prompt of agent", "the tail of chat"}
	var b strings.Builder
	for i := 0; b.Len() < 16_000; i++ {
		fmt.Fprintf(&b, "%s %s %s %d while the queue holds %d others. ",
			subjects[i%len(subjects)], verbs[(i/len(subjects))%len(verbs)], objects[i%len(objects)], i, i*7%31)
	}
	return b.String()
}

// Four chats without session ids to four simulated workers, each one user message made of the same
// 3,000-word document followed by a question of a different length: the router sees the prefix
// they share, as the workers' prefix caches do, so every chat after the first goes to the first's
// worker with the document matched, and that worker serves the document from its cache.
func TestCacheAwareSendsChatsSharingADocumentInOneMessageToItsHolder(t *testing.T) {
	tr := cacheAwareOverSims(t, 4)
	document := sharedDocument()
	if words := len(strings.Fields(document)); words < 2_900 || words > 3_300 {
		t.Fatalf("the document has %d words, want about 3,000", words)
	}
	tails := []string{
		"Summarize it.",
		"Which worker evicts the most blocks, and when? " + strings.Repeat("Explain step by step. ", 5),
		"List every request number the text names. " + strings.Repeat("Be exhaustive and precise. ", 40),
		"Rewrite it as a table. " + strings.Repeat("Keep every number exactly as it is written. ", 120),
	}
	home, firstPrompt := "", 0
	for i, tail := range tails {
		content := document + "\n\n" + tail
		body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 8,
			"messages": []map[string]string{{"role": "user", "content": content}}})
		resp := tr.post(t, "/v1/chat/completions", string(body))
		raw := readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("chat %d: %d %s", i, resp.StatusCode, raw)
		}
		var reply chatReply
		if err := json.Unmarshal([]byte(raw), &reply); err != nil || len(reply.Choices) == 0 {
			t.Fatalf("chat %d: bad reply %s", i, raw)
		}
		worker, decision := resp.Header.Get(proxy.HeaderWorker), resp.Header.Get(proxy.HeaderDecision)
		match, err := strconv.ParseFloat(resp.Header.Get(proxy.HeaderPrefixMatch), 64)
		if err != nil {
			t.Fatalf("chat %d: prefix match %q: %v", i, resp.Header.Get(proxy.HeaderPrefixMatch), err)
		}
		if i == 0 {
			home, firstPrompt = worker, reply.Usage.PromptTokens
			continue
		}
		// The document is most of every chat's key: at least half of the longest.
		if worker != home || decision != "cache_affinity" || match < 0.5 {
			t.Fatalf("chat %d: %s on %s with prefix match %v; want cache_affinity on the document's holder %s with at least half matched",
				i, decision, worker, match, home)
		}
		// The first chat's prompt is the document and a short question: its worker serves at least
		// nine tenths of it again from cache.
		if cached := reply.Usage.PromptTokensDetails.CachedTokens; cached*10 < firstPrompt*9 {
			t.Fatalf("chat %d: %d cached tokens, want at least 9/10 of the first prompt's %d", i, cached, firstPrompt)
		}
	}
	if firstPrompt < 4_000 {
		t.Fatalf("the first prompt is %d tokens; the test needs the document to be thousands", firstPrompt)
	}
}
