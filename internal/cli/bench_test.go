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
