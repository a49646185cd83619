package bench

import (
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
)

// cctraceSample is the one session of the real trace set kept uncompressed beside the set: a
// Claude Code session with a sub-agent, its s/n twins, about 20 requests of up to 76k tokens.
const cctraceSample = "sample_v6_trace_0287_with_subagent.json"

// cctraceData returns the directory of the real trace set (shared/data/cctrace-v6, in a folder
// beside the repository or beside one of its parents), or skips the test when there is none.
// The data is not part of the repository.
func cctraceData(t *testing.T) string {
	t.Helper()
	wd, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	root := wd
	for root != filepath.Dir(root) {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		root = filepath.Dir(root)
	}
	for dir := filepath.Dir(root); ; dir = filepath.Dir(dir) {
		data := filepath.Join(dir, "shared", "data", "cctrace-v6")
		if _, err := os.Stat(filepath.Join(data, cctraceSample)); err == nil {
			return data
		}
		if dir == filepath.Dir(dir) {
			t.Skipf("the real trace set (shared/data/cctrace-v6/%s beside the repository) is not here", cctraceSample)
		}
	}
}

// The real session replayed one request at a time through 2 simulated workers with room for
// everything: cache_aware with session ids keeps each session on its worker and reaches the
// trace's own reuse ceiling, and the router's prediction agrees; round_robin, which spreads each
// session over both workers, stays below. Then the same fleet with KV for half the working sets
// reports its pressure. One request at a time, since with two a turn can find its worker busy
// with the other session's first prefill and rightly move to the idle one (session_moved), which
// computes it again.
func TestCCTraceReplayOfARealSessionReachesItsCeilingWhenNothingIsEvicted(t *testing.T) {
	files, err := ReadCCTraces(filepath.Join(cctraceData(t), cctraceSample), 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	w, err := CCTrace(files, CCTraceConfig{BlockTokens: 16})
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Sessions) != 2 || w.ReuseCeiling == nil {
		t.Fatalf("%d sessions, ceiling %v; want the session and its sub-agent", len(w.Sessions), w.ReuseCeiling)
	}
	simCfg := scaledSim(0.002)
	simCfg.BlockSize = 16
	simCfg.KVCacheBlocks = 8192
	simCfg.MaxNumSeqs = 64
	rep := mustRun(t, Options{Workload: w, Policies: mustPolicies(t, []string{"round_robin,cache_aware"}, SessionHeader),
		Workers: 2, Sim: simCfg, Concurrency: 1, Timeout: time.Minute})
	if rep.ReuseCeiling == nil || *rep.ReuseCeiling != *w.ReuseCeiling {
		t.Fatalf("report's ceiling %v, workload's %v", rep.ReuseCeiling, *w.ReuseCeiling)
	}
	ceiling := *w.ReuseCeiling
	rr, ca := rep.Targets[0], rep.Targets[1]
	for _, tr := range rep.Targets {
		if tr.Errors != 0 || tr.Requests != w.Requests() {
			t.Fatalf("%s: %d of %d requests, errors %v", tr.Name, tr.Requests, w.Requests(), tr.ErrorSamples)
		}
		if tr.HitRate > ceiling {
			t.Fatalf("%s: hit rate %.4f above the ceiling %.4f", tr.Name, tr.HitRate, ceiling)
		}
		if tr.Pressure == nil || tr.Pressure.KVCapacityTokens != 2*8192*16 || tr.Preemptions == nil || *tr.Preemptions != 0 {
			t.Fatalf("%s: pressure %+v, preemptions %v; want the capacity known and nothing preempted", tr.Name, tr.Pressure, tr.Preemptions)
		}
	}
	// The hit rate counts the few template tokens after the last block of every prompt; the
	// ceiling counts blocks: they agree within a thousandth.
	if math.Abs(ca.HitRate-ceiling) > 0.001 {
		t.Fatalf("cache_aware hit rate %.4f, ceiling %.4f: want the ceiling, nothing being evicted", ca.HitRate, ceiling)
	}
	if ca.PredictedHitRate == nil || math.Abs(*ca.PredictedHitRate-ca.HitRate) > 0.02 {
		t.Fatalf("cache_aware predicted %s, achieved %.4f: the router's history keys should see the reuse", optPct(ca.PredictedHitRate), ca.HitRate)
	}
	if !(rr.HitRate < ca.HitRate-0.05) {
		t.Fatalf("round_robin %.4f, cache_aware %.4f: want round_robin well below", rr.HitRate, ca.HitRate)
	}
	if ca.SameWorker == nil || *ca.SameWorker != 1 || ca.Decisions[cacheaware.LabelSessionMoved] != 0 {
		t.Fatalf("cache_aware: %s of later turns on their session's worker, decisions %v; want every one", optPct(ca.SameWorker), ca.Decisions)
	}

	// Cut at 300 blocks, one session at a time on one worker whose KV is twice the mean working
	// set: the report says how much of the KV the session in progress asked for. The sub-agent
	// finds no room while the parent session is live, and on the router's clock (not scaled) the
	// parent stays live for half a minute: session admission is off, so it is placed at once.
	w, err = CCTrace(files, CCTraceConfig{BlockTokens: 16, MaxBlocks: 300})
	if err != nil {
		t.Fatal(err)
	}
	placeAtOnce := mustPolicies(t, []string{"cache_aware"}, SessionHeader)
	if err := ApplyRouterArgs(placeAtOnce, []string{"--session-admission=false"}); err != nil {
		t.Fatal(err)
	}
	rep = mustRun(t, Options{Workload: w, Policies: placeAtOnce, Workers: 1, Sim: simCfg,
		KVOversubscription: 0.5, Concurrency: 1, Timeout: time.Minute})
	tr := rep.Targets[0]
	blocks, _ := rep.Params["kv_cache_blocks"].(int)
	if tr.Errors != 0 || tr.Pressure == nil || tr.Pressure.KVCapacityTokens != int64(16*blocks) || !(tr.Pressure.Mean > 0 && tr.Pressure.Mean <= tr.Pressure.Peak && tr.Pressure.Peak <= 1) {
		t.Fatalf("errors %v, pressure %+v, params %v; want the oversubscription measured, below 1", tr.ErrorSamples, tr.Pressure, rep.Params)
	}
}
