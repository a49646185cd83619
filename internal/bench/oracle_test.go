package bench

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/sim"
)

func TestOracleSendsATurnToTheWorkerThatHoldsItsConversation(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.TimeScale = 0
	fleet, err := sim.StartLocal(3, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	or, err := startOracle(fleet, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer or.stop()

	doc := strings.Repeat("a long shared document about routing and caches. ", 60)
	first := map[string]any{"model": "sim-model", "max_tokens": 4, "messages": []map[string]string{{"role": "user", "content": doc}}}
	// The first turn goes straight to worker 2, behind the oracle's back.
	post(t, fleet.URLs()[2], first)

	next := map[string]any{"model": "sim-model", "max_tokens": 4, "messages": []map[string]string{
		{"role": "user", "content": doc}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "and then?"}}}
	resp := post(t, or.url, next)
	if got := resp.Header.Get(headerRouterWorker); got != fleet.URLs()[2] {
		t.Fatalf("the oracle sent the turn to %s, want %s, which holds its conversation", got, fleet.URLs()[2])
	}
	if resp.Header.Get(headerRouterDecision) != oracleDecision || resp.Header.Get(headerPrefixMatch) == "" || resp.Header.Get(headerPrefixMatch) == "0.0000" {
		t.Fatalf("headers %v: want the oracle's decision and the held fraction", resp.Header)
	}
	var r struct {
		Usage struct {
			PromptTokensDetails struct {
				CachedTokens int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil || r.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("the turn hit %d tokens (%v), want its conversation from cache", r.Usage.PromptTokensDetails.CachedTokens, err)
	}

	// What nobody holds goes to a worker that is not busy; other APIs are refused.
	if resp := post(t, or.url, map[string]any{"model": "sim-model", "messages": []map[string]string{{"role": "user", "content": "unrelated"}}}); resp.StatusCode != http.StatusOK {
		t.Fatalf("a request nobody holds: %d", resp.StatusCode)
	}
	if resp, err := http.Post(or.url+"/v1/messages", "application/json", strings.NewReader("{}")); err != nil || resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("messages through the oracle: %v %v, want 400", resp, err)
	}
}

func TestOracleRunsAsABenchPolicy(t *testing.T) {
	w := mustAgent(t, AgentConfig{Sessions: 4, Turns: 4, SharedPrefixTokens: 64, ToolSets: 1, TaskTokens: 300,
		ToolResult: Dist{Kind: "fixed", A: 200}, OutputTokens: 8, Seed: 5})
	cfg := scaledSim(0.01)
	policies := mustPolicies(t, []string{"round_robin,oracle"}, SessionNone)
	rep := mustRun(t, Options{Workload: w, Policies: policies, Workers: 3, Sim: cfg, Concurrency: 2, Timeout: 30 * time.Second})
	rr, or := rep.Targets[0], rep.Targets[1]
	if or.Errors != 0 || or.Decisions[oracleDecision] != or.Requests || or.Requests != 16 {
		t.Fatalf("oracle: %d requests, %d errors %v, decisions %v", or.Requests, or.Errors, or.ErrorSamples, or.Decisions)
	}
	if or.HitRate <= rr.HitRate {
		t.Fatalf("oracle hit rate %.3f, round robin %.3f: the oracle should hold more", or.HitRate, rr.HitRate)
	}
	if _, err := Run(t.Context(), Options{Workload: w, Policies: policies[1:], Workers: 2, Sim: cfg, API: APIMessages, Timeout: time.Second}); err == nil {
		t.Fatal("the oracle ran --api messages, which it cannot route")
	}
}

func TestOracleTakesNoRouterArgs(t *testing.T) {
	specs := mustPolicies(t, []string{"cache_aware,best=oracle"}, SessionNone)
	if err := ApplyRouterArgs(specs, []string{"--cache-threshold=0.5"}); err != nil || len(specs[1].Args) != 0 || len(specs[0].Args) != 1 {
		t.Fatalf("an arg for every entry: %v, args %v / %v; want it on the router entry only", err, specs[0].Args, specs[1].Args)
	}
	if err := ApplyRouterArgs(specs, []string{"best=--cache-threshold=0.5"}); err == nil || !strings.Contains(err.Error(), "runs no router") {
		t.Fatalf("an arg for the oracle: %v, want it refused", err)
	}
}

func post(t *testing.T, url string, body any) *http.Response {
	t.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}
