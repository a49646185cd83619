package router

import (
	"encoding/json"
	"fmt"
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

// Eight agent sessions of four turns each through a cache_aware router to three simulated workers:
// every turn of a session lands on one worker, by session match from turn 2 on, and that worker's
// prefix cache serves at least the previous turn's whole prompt.
func TestCacheAwareKeepsSessionsOnTheirWorkersCache(t *testing.T) {
	simCfg := sim.DefaultConfig()
	simCfg.TimeScale = 0
	fleet, err := sim.StartLocal(3, simCfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	tr := startRouter(t, cfg)
	for _, u := range fleet.URLs() {
		if err := tr.AddWorker(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
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
				block := simCfg.BlockSize
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
