package cli

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/cacheroute/cacheroute/internal/bench"
)

// newDemoCommand returns `cacheroute demo`: simulated workers, one router per policy and a short
// agent workload, all in this process, ending with the comparison table.
func newDemoCommand() *cobra.Command {
	var outChart, outJSON, outMD, portRange string
	var quiet bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Compare routing policies on simulated workers, with no setup (about 20 seconds)",
		Long: fmt.Sprintf(`demo starts %d simulated vLLM workers whose KV caches cannot hold every agent session at once,
publishing their KV-cache events, and one cacheroute router per policy (%s) in this process. It runs the same
multi-turn agent workload through each router, emptying the workers' caches between runs, and
prints the prompt-cache hit rate, TTFT, throughput and load balance side by side, then writes a
chart (by default to %s).

It is 'cacheroute bench --policies ...' with fixed settings; see docs/benchmarks.md.`,
			bench.DemoWorkers, strings.Join(bench.DemoPolicies, ", "), defaultDemoChart()),
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if outChart == "" {
				outChart = defaultDemoChart()
			}
			opts, err := demoOptions()
			if err != nil {
				return err
			}
			if portRange != "" {
				if opts.Ports, err = bench.ParsePortRange(portRange); err != nil {
					return err
				}
			}
			if !quiet {
				opts.Progress = bench.NewProgress(cmd.ErrOrStderr(), bench.IsTerminal(os.Stderr))
			}
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "cacheroute demo: %d simulated workers, %d agent sessions × %d turns, %d at once, policies %s\n\n",
				opts.Workers, opts.Workload.Requests()/bench.DemoAgent().Turns, bench.DemoAgent().Turns, opts.Concurrency, strings.Join(bench.DemoPolicies, ", "))
			ctx, stop := interruptible(cmd.Context())
			defer stop()
			began := time.Now()
			rep, err := bench.Run(ctx, opts)
			if err != nil {
				return err
			}
			if err := writeReport(out, rep, outJSON, outMD, outChart); err != nil {
				return err
			}
			fmt.Fprintf(out, "demo finished in %s\n", time.Since(began).Round(100*time.Millisecond))
			return nil
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&outChart, "out-chart", "", "where to write the SVG chart (default "+defaultDemoChart()+")")
	fs.StringVar(&outJSON, "out-json", "", "also write the report as JSON to this file")
	fs.StringVar(&outMD, "out-md", "", "also write the report as a Markdown table to this file")
	fs.BoolVar(&quiet, "quiet", false, "no progress on stderr")
	fs.StringVar(&portRange, "port-range", "", fmt.Sprintf("listen only on the loopback ports LO-HI, e.g. 20000-20100: the simulated workers, their KV-cache event publishers and the routers, %d ports (default: ports the system picks)",
		2*bench.DemoWorkers+len(bench.DemoPolicies)))
	return cmd
}

// defaultDemoChart is the chart's default path: in the system's temporary directory, so a demo
// run leaves nothing in the working directory.
func defaultDemoChart() string { return filepath.Join(os.TempDir(), "cacheroute-demo.svg") }

// demoOptions are the demo's fixed bench options.
func demoOptions() (bench.Options, error) {
	agent := bench.DemoAgent()
	w, err := bench.Agent(agent)
	if err != nil {
		return bench.Options{}, err
	}
	policies, err := bench.ParsePolicies(bench.DemoPolicies, bench.SessionHeader)
	if err != nil {
		return bench.Options{}, err
	}
	return bench.Options{
		Workload: w, Policies: policies, Workers: bench.DemoWorkers, Sim: bench.DemoSim(),
		Concurrency: bench.DemoConcurrency, Timeout: 2 * time.Minute, KVEvents: true,
		Params: map[string]any{"sessions": agent.Sessions, "turns": agent.Turns, "shared_prefix_tokens": agent.SharedPrefixTokens,
			"tool_sets": agent.ToolSets, "tool_result_dist": agent.ToolResult.String(), "output_tokens": agent.OutputTokens, "seed": agent.Seed},
	}, nil
}
