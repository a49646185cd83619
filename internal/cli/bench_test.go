package cli

import (
	"io"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/bench"
)

func TestBenchAPIDefaultsToChat(t *testing.T) {
	cmd := newBenchCommand()
	got, err := cmd.Flags().GetString("api")
	if err != nil || got != bench.APIChat {
		t.Fatalf("--api default %q, %v", got, err)
	}
	opts, err := demoOptions()
	if err != nil || (opts.API != "" && opts.API != bench.APIChat) {
		t.Fatalf("the demo runs --api %q (%v), want chat", opts.API, err)
	}
}

// The simulated workers of bench and demo publish their KV-cache events unless told not to, so
// replica counts are compared with the routers reading the engines.
func TestBenchAndDemoRunWithTheEnginesEventsByDefault(t *testing.T) {
	for _, c := range []struct {
		args []string
		want bool
	}{{nil, true}, {[]string{"--kv-events=false"}, false}} {
		cmd := newBenchCommand()
		if err := cmd.Flags().Parse(c.args); err != nil {
			t.Fatal(err)
		}
		if got, err := cmd.Flags().GetBool("kv-events"); err != nil || got != c.want {
			t.Errorf("bench %v: --kv-events %v (%v), want %v", c.args, got, err, c.want)
		}
	}
	opts, err := demoOptions()
	if err != nil || !opts.KVEvents {
		t.Fatalf("the demo runs with KVEvents %v (%v), want true", opts.KVEvents, err)
	}
}

func TestBenchRejectsAnUnknownAPIBeforeRunning(t *testing.T) {
	cmd := newBenchCommand()
	cmd.SetArgs([]string{"--api", "completions", "--policies", "round_robin", "--quiet"})
	cmd.SetOut(io.Discard)
	err := cmd.Execute()
	if err == nil || !strings.Contains(err.Error(), "--api") || !strings.Contains(err.Error(), "responses-chain") {
		t.Fatalf("error %v", err)
	}
}

func TestBenchPassesTheAPIToTheRun(t *testing.T) {
	for _, api := range bench.APIs {
		f := benchFlags{agent: bench.DefaultAgentConfig(), sessionMode: bench.SessionHeader, api: api,
			policies: []string{"cache_aware"}, workers: 4, replicas: 1, targetTimeScale: 1, concurrency: 1, toolResult: "fixed:10", workload: "agent"}
		opts, err := f.options(bench.DemoSim())
		if err != nil || opts.API != api {
			t.Fatalf("--api %s: options.API %q, %v", api, opts.API, err)
		}
	}
}

func TestBenchRouterArgsReachTheirNamedEntries(t *testing.T) {
	f := benchFlags{agent: bench.DefaultAgentConfig(), sessionMode: bench.SessionHeader, api: bench.APIChat, workers: 4, replicas: 2,
		targetTimeScale: 1, concurrency: 1, toolResult: "fixed:10", workload: "agent",
		policies:   []string{"requests=cache_aware", "engine=cache_aware:none"},
		routerArgs: []string{"--balance-abs-threshold=8", "engine=--load-signal=engine"}}
	opts, err := f.options(bench.DemoSim())
	if err != nil {
		t.Fatal(err)
	}
	if opts.Replicas != 2 || len(opts.Policies) != 2 || opts.Policies[1].Name != "engine" || opts.Policies[1].SessionMode != bench.SessionNone {
		t.Fatalf("options %+v", opts.Policies)
	}
	if got := strings.Join(opts.Policies[0].Args, " "); got != "--balance-abs-threshold=8" {
		t.Fatalf("requests: args %q", got)
	}
	if got := strings.Join(opts.Policies[1].Args, " "); got != "--balance-abs-threshold=8 --load-signal=engine" {
		t.Fatalf("engine: args %q", got)
	}
}

func TestBenchRefusesBadRouterArgsAndReplicasBeforeRunning(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--policies", "cache_aware", "--router-arg", "--port=1"}, "the bench sets --port itself"},
		{[]string{"--policies", "a=cache_aware", "--router-arg", "b=--load-signal=engine"}, `no --policies entry named "b"`},
		{[]string{"--policies", "a=cache_aware,a=round_robin"}, "given twice"},
		{[]string{"--target", "x=http://127.0.0.1:1", "--router-arg", "--load-signal=engine"}, "--router-arg configures the in-process routers"},
		{[]string{"--policies", "cache_aware", "--replicas", "0"}, "--replicas must be at least 1"},
	} {
		cmd := newBenchCommand()
		cmd.SetArgs(append(c.args, "--quiet"))
		cmd.SetOut(io.Discard)
		if err := cmd.Execute(); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.args, err, c.want)
		}
	}
}
