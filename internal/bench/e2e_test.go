package bench

import (
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/sim"
)

// A tiny bench in this process: 2 simulated workers, a round_robin and a cache_aware router, and
// an agent workload built so that placement matters: little shared prefix and long private
// histories, one session at a time. round_robin alternates a session's turns between the
// workers, so each turn finds only the history up to the turn before last; cache_aware keeps the
// session on one worker, which holds the whole previous turn. One session at a time keeps the
// outcome free of timing.
func TestInProcessBenchCacheAwareBeatsRoundRobin(t *testing.T) {
	agent := AgentConfig{Sessions: 6, Turns: 5, SharedPrefixTokens: 64, ToolSets: 1, TaskTokens: 300,
		ToolResult: Dist{Kind: "fixed", A: 250}, OutputTokens: 8, Seed: 3}
	w, err := Agent(agent)
	if err != nil {
		t.Fatal(err)
	}
	simCfg := sim.DefaultConfig()
	simCfg.TimeScale = 0.01
	simCfg.KVCacheBlocks = 320
	policies, err := ParsePolicies([]string{"round_robin,cache_aware"}, SessionHeader)
	if err != nil {
		t.Fatal(err)
	}
	rep, err := Run(t.Context(), Options{Workload: w, Policies: policies, Workers: 2, Sim: simCfg,
		Concurrency: 1, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Targets) != 2 || rep.Requests != 30 || rep.Sessions != 6 || rep.TimeScale != 0.01 {
		t.Fatalf("report %+v", rep)
	}
	rr, ca := rep.Targets[0], rep.Targets[1]
	for _, tr := range rep.Targets {
		if tr.Requests != 30 || tr.Errors != 0 || tr.Skipped != 0 {
			t.Fatalf("%s: %d requests, %d errors %v, %d skipped", tr.Name, tr.Requests, tr.Errors, tr.ErrorSamples, tr.Skipped)
		}
		if len(tr.WorkerShare) == 0 || len(tr.WorkerShare) > 2 || len(tr.URLs) != 1 || tr.PromptTokens == 0 {
			t.Fatalf("%s: shares %v urls %v", tr.Name, tr.WorkerShare, tr.URLs)
		}
		if tr.WorkerHitRate == nil || *tr.WorkerHitRate != tr.HitRate {
			t.Fatalf("%s: worker metrics hit rate %v, responses %v", tr.Name, tr.WorkerHitRate, tr.HitRate)
		}
		if tr.TTFT.P50 <= 0 || tr.TTFT.P99 < tr.TTFT.P50 || tr.E2E.P50 < tr.TTFT.P50 {
			t.Fatalf("%s: ttft %+v e2e %+v", tr.Name, tr.TTFT, tr.E2E)
		}
	}
	if rr.Decisions["round_robin"] != 30 || rr.Policy != "round_robin" {
		t.Fatalf("round_robin decisions %v", rr.Decisions)
	}
	if ca.Decisions["session_id_match"] < 20 {
		t.Fatalf("cache_aware decisions %v", ca.Decisions)
	}
	if !(ca.HitRate > rr.HitRate+0.1) {
		t.Fatalf("cache_aware hit rate %.3f, round_robin %.3f: want cache_aware well above", ca.HitRate, rr.HitRate)
	}
	t.Logf("round_robin %.3f, cache_aware %.3f", rr.HitRate, ca.HitRate)
}
