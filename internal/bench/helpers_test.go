package bench

import (
	"testing"

	"github.com/cacheroute/cacheroute/internal/sim"
)

// mustPolicies parses a test's policy entries with ParsePolicies, failing the test on an entry it
// refuses: the benches below start from entries they know to be valid.
func mustPolicies(t *testing.T, list []string, defaultMode string) []PolicySpec {
	t.Helper()
	ps, err := ParsePolicies(list, defaultMode)
	if err != nil {
		t.Fatal(err)
	}
	return ps
}

// scaledSim is the default simulated worker with its sleeps multiplied by scale, so that an
// in-process bench takes a fraction of the time its workload would take on real engines.
func scaledSim(scale float64) sim.Config {
	c := sim.DefaultConfig()
	c.TimeScale = scale
	return c
}

// mustRun runs a bench with Run, failing the test on the error Run returns: the tests that call
// it check what a run reports, not whether it starts.
func mustRun(t *testing.T, o Options) *Report {
	t.Helper()
	rep, err := Run(t.Context(), o)
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// mustAgent builds the agent workload of c, failing the test on a config Agent refuses.
func mustAgent(t *testing.T, c AgentConfig) Workload {
	t.Helper()
	w, err := Agent(c)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

// shortAgent is an agent workload of short sessions with little shared prefix (64 tokens),
// 100-token tasks, 50-token tool results and 8-token replies: a run stays short while each turn
// still resends its session's history.
func shortAgent(t *testing.T, sessions, turns int, seed uint64) Workload {
	t.Helper()
	return mustAgent(t, AgentConfig{Sessions: sessions, Turns: turns, SharedPrefixTokens: 64, ToolSets: 1, TaskTokens: 100,
		ToolResult: Dist{Kind: "fixed", A: 50}, OutputTokens: 8, Seed: seed})
}
