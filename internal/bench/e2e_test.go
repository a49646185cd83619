package bench

import (
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/session/redistest"
	"github.com/cacheroute/cacheroute/internal/sim"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// A tiny bench in this process: 2 simulated workers, a round_robin and a cache_aware router, and
// an agent workload built so that placement matters: little shared prefix and long private
// histories, one session at a time. round_robin alternates a session's turns between the
// workers, so each turn finds only the history up to the turn before last; cache_aware keeps the
// session on one worker, which holds the whole previous turn. One session at a time keeps the
// outcome free of timing.
func TestInProcessBenchCacheAwareBeatsRoundRobin(t *testing.T) {
	w := mustAgent(t, AgentConfig{Sessions: 6, Turns: 5, SharedPrefixTokens: 64, ToolSets: 1, TaskTokens: 300,
		ToolResult: Dist{Kind: "fixed", A: 250}, OutputTokens: 8, Seed: 3})
	simCfg := scaledSim(0.01)
	simCfg.KVCacheBlocks = 320
	rep := mustRun(t, Options{Workload: w, Policies: mustPolicies(t, []string{"round_robin,cache_aware"}, SessionHeader),
		Workers: 2, Sim: simCfg, Concurrency: 1, Timeout: 30 * time.Second})
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
		if tr.ITL.P50 <= 0 || tr.ITL.P99 < tr.ITL.P50 { // 8-token replies: 7 gaps each
			t.Fatalf("%s: itl %+v", tr.Name, tr.ITL)
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

// chainBench runs an agent workload with --api responses-chain through one in-process router
// per policy over 4 simulated workers, one session at a time.
func chainBench(t *testing.T, api string, policies ...string) *Report {
	t.Helper()
	return mustRun(t, Options{Workload: tinyAgent(t, 8, 4), Policies: mustPolicies(t, policies, SessionHeader), Workers: 4,
		Sim: scaledSim(0.01), API: api, Concurrency: 1, Timeout: 30 * time.Second})
}

// A chained Responses session works only on the worker that stored its previous response.
// round_robin sends each session's second turn to the next worker, which answers 404.
func TestResponsesChainThroughRoundRobinFindsNoResponse(t *testing.T) {
	rep := chainBench(t, APIResponsesChain, "round_robin")
	rr := rep.Targets[0]
	if rr.ResponseNotFound == 0 {
		t.Fatalf("round_robin: no response-not-found failure; %d requests, %d errors %v", rr.Requests, rr.Errors, rr.ErrorSamples)
	}
	if rr.SameWorker == nil || *rr.SameWorker == 1 {
		t.Fatalf("round_robin: later turns all on the previous turn's worker (%v)", rr.SameWorker)
	}
	t.Logf("round_robin: %d not found, %d skipped, errors %v", rr.ResponseNotFound, rr.Skipped, rr.ErrorSamples)
}

// cache_aware follows previous_response_id to the worker that stored the response: no turn
// fails and every later turn stays on its session's worker.
func TestResponsesChainThroughCacheAwareFollowsTheResponseID(t *testing.T) {
	rep := chainBench(t, APIResponsesChain, "cache_aware")
	ca := rep.Targets[0]
	if ca.Errors != 0 || ca.Skipped != 0 || ca.ResponseNotFound != 0 || ca.Requests != 32 {
		t.Fatalf("cache_aware: %d requests, %d errors (%d not found) %v, %d skipped", ca.Requests, ca.Errors, ca.ResponseNotFound, ca.ErrorSamples, ca.Skipped)
	}
	if ca.SameWorker == nil || *ca.SameWorker != 1 {
		t.Fatalf("cache_aware: same worker share %v, want 100%%", ca.SameWorker)
	}
	if got := ca.Decisions["response_id_match"]; got != 8*3 {
		t.Fatalf("cache_aware: decisions %v, want response_id_match for all 24 later turns", ca.Decisions)
	}
	if ca.HitRate < 0.5 {
		t.Fatalf("cache_aware: hit rate %.3f", ca.HitRate)
	}
}

// Every API the bench speaks is served by the simulated workers through the router, with the
// session kept on one worker and its history found in that worker's cache.
func TestEveryAPIKeepsItsSessionOnOneWorkerThroughCacheAware(t *testing.T) {
	for _, api := range []string{APIChat, APIResponses, APIMessages} {
		rep := chainBench(t, api, "cache_aware")
		ca := rep.Targets[0]
		if ca.Errors != 0 || ca.Requests != 32 || ca.SameWorker == nil || *ca.SameWorker != 1 {
			t.Fatalf("%s: %d requests, %d errors %v, same worker %v", api, ca.Requests, ca.Errors, ca.ErrorSamples, ca.SameWorker)
		}
		if ca.WorkerHitRate == nil || ca.HitRate < 0.5 || *ca.WorkerHitRate-ca.HitRate > 0.01 || ca.HitRate-*ca.WorkerHitRate > 0.01 {
			t.Fatalf("%s: hit rate %.3f, worker counters %v", api, ca.HitRate, ca.WorkerHitRate)
		}
		t.Logf("%s: hit rate %.3f, decisions %v", api, ca.HitRate, ca.Decisions)
	}
}

// replayAgent is a short agent workload for the in-process tests below.
func replayAgent(t *testing.T, sessions int) Workload {
	t.Helper()
	return shortAgent(t, sessions, 4, 7)
}

// --router-arg reaches only the entry it names: with the balance gate at zero (any difference
// in load trips it), cache_aware answers some requests load_balance when sessions run side by
// side, which the same router with its default gate (64) never does. The requests carry no
// session id, so the decision chain and its gate place them (with ids, the pressure-aware
// placement weighs load by predicted time instead). The report shows the args, and cache_aware's
// predicted hit rate, as every answer carries its prefix match.
func TestRouterArgTakesEffectOnTheEntryItNames(t *testing.T) {
	ps := mustPolicies(t, []string{"plain=cache_aware:none,gated=cache_aware:none"}, SessionHeader)
	args := []string{"gated=--balance-abs-threshold=0", "gated=--balance-rel-threshold=1"}
	if err := ApplyRouterArgs(ps, args); err != nil {
		t.Fatal(err)
	}
	rep := mustRun(t, Options{Workload: replayAgent(t, 8), Policies: ps, Workers: 2, Sim: scaledSim(0.01),
		Concurrency: 4, Timeout: 30 * time.Second})
	plain, gated := rep.Targets[0], rep.Targets[1]
	for _, tr := range rep.Targets {
		if tr.Errors != 0 || tr.Requests != 32 {
			t.Fatalf("%s: %d requests, %d errors %v", tr.Name, tr.Requests, tr.Errors, tr.ErrorSamples)
		}
		if tr.PredictedHitRate == nil || *tr.PredictedHitRate <= 0 || *tr.PredictedHitRate > 1 {
			t.Fatalf("%s: predicted hit rate %v, want in (0, 1]", tr.Name, tr.PredictedHitRate)
		}
	}
	if plain.Decisions["load_balance"] != 0 || len(plain.RouterArgs) != 0 {
		t.Fatalf("plain: decisions %v, args %q", plain.Decisions, plain.RouterArgs)
	}
	if gated.Decisions["load_balance"] == 0 || strings.Join(gated.RouterArgs, " ") != "--balance-abs-threshold=0 --balance-rel-threshold=1" {
		t.Fatalf("gated: decisions %v, args %q", gated.Decisions, gated.RouterArgs)
	}
	var table, js strings.Builder
	if err := WriteTable(&table, rep); err != nil {
		t.Fatal(err)
	}
	if err := WriteJSON(&js, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(table.String(), "router:    --balance-abs-threshold=0 --balance-rel-threshold=1") || !strings.Contains(table.String(), "predicted") {
		t.Fatalf("table:\n%s", table.String())
	}
	if !strings.Contains(js.String(), `"router_args": [`) || !strings.Contains(js.String(), `"predicted_hit_rate": 0.`) {
		t.Fatalf("json:\n%s", js.String())
	}
	t.Logf("gated decisions %v; predicted %.3f / %.3f, hit rate %.3f / %.3f", gated.Decisions,
		*plain.PredictedHitRate, *gated.PredictedHitRate, plain.HitRate, gated.HitRate)
}

// With --replicas 2 the bench's requests alternate between two cache_aware routers, so each
// session's turns cross replicas. Sharing the session map through the bench's redis-server,
// both send every later turn to the session's worker by its id; with --session-store=memory
// each replica knows only the sessions it placed, so every second turn reaches a replica that
// has never seen its session.
func TestReplicasShareTheirSessionsThroughRedis(t *testing.T) {
	redistest.Require(t)
	ps := mustPolicies(t, []string{"shared=cache_aware,own=cache_aware"}, SessionHeader)
	if err := ApplyRouterArgs(ps, []string{"own=--session-store=memory"}); err != nil {
		t.Fatal(err)
	}
	rep := mustRun(t, Options{Workload: replayAgent(t, 4), Policies: ps, Workers: 4, Replicas: 2, Sim: scaledSim(0.01),
		Concurrency: 1, Timeout: 30 * time.Second})
	shared, own := rep.Targets[0], rep.Targets[1]
	for _, tr := range rep.Targets {
		if tr.Errors != 0 || tr.Requests != 16 || len(tr.URLs) != 2 || tr.Replicas != 2 {
			t.Fatalf("%s: %d requests, %d errors %v, urls %v, replicas %d", tr.Name, tr.Requests, tr.Errors, tr.ErrorSamples, tr.URLs, tr.Replicas)
		}
	}
	if shared.SessionStore != "redis" || shared.SameWorker == nil || *shared.SameWorker != 1 || shared.Decisions["session_id_match"] != 12 {
		t.Fatalf("shared: store %s, same worker %s, decisions %v", shared.SessionStore, optPct(shared.SameWorker), shared.Decisions)
	}
	if own.SessionStore != "memory" || own.Decisions["session_id_match"] >= 12 {
		t.Fatalf("own: store %s, decisions %v", own.SessionStore, own.Decisions)
	}
	var md strings.Builder
	if err := WriteMarkdown(&md, rep); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(md.String(), "2 replicas sharing sessions through Redis") || !strings.Contains(md.String(), "2 replicas, each with its own session map") {
		t.Fatalf("markdown:\n%s", md.String())
	}
}

// The loads sampled for the imbalance are each worker's in-flight requests summed over the
// replicas, whichever order each replica lists its workers in.
func TestReplicaLoadsAreSummedPerWorker(t *testing.T) {
	fleet, err := sim.StartLocal(2, sim.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	urls := fleet.URLs()
	a, err := routerConfig(PolicySpec{Name: "a", Policy: "round_robin"}, urls, "", 1)
	if err != nil {
		t.Fatal(err)
	}
	b := a
	b.WorkerURLs = []string{urls[1], urls[0]}
	ra, err := startReplicas(t.Context(), a, "a", 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := startReplicas(t.Context(), b, "b", 1, nil)
	if err != nil {
		ra.stop()
		t.Fatal(err)
	}
	rs := append(ra, rb...)
	defer rs.stop()
	// Leases taken as the proxy takes them: two on the first worker through the first replica,
	// one on the first worker and four on the second through the other.
	lease := func(lr *localRouter, url string, n int) {
		for _, w := range lr.r.Pool().All() {
			if w.URL() != url {
				continue
			}
			for range n {
				at := lr.r.Pool().Acquire(w)
				if at == nil {
					t.Fatal("breaker refused")
				}
				t.Cleanup(func() { at.Close(workers.Succeeded) })
			}
		}
	}
	lease(rs[0], urls[0], 2)
	lease(rs[1], urls[0], 1)
	lease(rs[1], urls[1], 4)
	if got := rs.loads(); len(got) != 2 || got[0] != 3 || got[1] != 4 {
		t.Fatalf("loads %v, want [3 4]", got)
	}
}

func TestReplicasWithoutRedisServerFailBeforeRunning(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	ps := mustPolicies(t, []string{"cache_aware"}, SessionHeader)
	rep, err := Run(t.Context(), Options{Workload: replayAgent(t, 1), Policies: ps, Workers: 1, Replicas: 2, Sim: sim.DefaultConfig(), Concurrency: 1})
	if err == nil || !strings.Contains(err.Error(), "--replicas 2") || !strings.Contains(err.Error(), "redis-server not found") || len(rep.Targets) != 0 {
		t.Fatalf("error %v", err)
	}
}

// With --kv-events the simulated workers publish their caches and the routers read them: two
// replicas without session ids, each seeing only half of every conversation's turns, place turns
// by what the engines report. (How often a turn's predecessor is already indexed when it arrives
// depends on timing, which a test does not assert: the bench's figures are in docs/kv-events.md.)
func TestKVEventsLetReplicasWithoutSessionIDsFollowTheEngines(t *testing.T) {
	redistest.Require(t)
	rep := mustRun(t, Options{Workload: replayAgent(t, 4), Policies: mustPolicies(t, []string{"cache_aware:none"}, SessionHeader),
		Workers: 4, Replicas: 2, Sim: scaledSim(0.01), KVEvents: true, Concurrency: 1, Timeout: 30 * time.Second})
	tr := rep.Targets[0]
	if tr.Errors != 0 || tr.Requests != 16 {
		t.Fatalf("%d requests, %d errors %v", tr.Requests, tr.Errors, tr.ErrorSamples)
	}
	if tr.Decisions["kv_events_match"] == 0 {
		t.Fatalf("decisions %v: no turn was placed by the engines' events", tr.Decisions)
	}
}
