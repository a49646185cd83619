package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cacheroute/cacheroute/internal/bench"
	"github.com/cacheroute/cacheroute/internal/sim"
)

// benchFlags holds every flag of `cacheroute bench`.
type benchFlags struct {
	workload    string
	agent       bench.AgentConfig
	toolResult  string
	input       string
	mooncake    bench.MooncakeConfig
	cctrace     bench.CCTraceConfig
	sessionMode string
	api         string

	targets         []string
	policies        []string
	routerArgs      []string
	replicas        int
	kvEvents        bool
	workers         int
	prefillWorkers  int
	decodeWorkers   int
	workerMetrics   []string
	targetTimeScale float64
	oversubscribe   float64
	sessionsSet     bool // --sessions was given: cctrace replays all sessions otherwise
	fronts          []string
	frontRound      int
	minPromptBytes  int
	maxPromptBytes  int

	model       string
	concurrency int
	timeout     time.Duration
	outJSON     string
	outMD       string
	outChart    string
	quiet       bool
	profiles    profiles
}

func newBenchCommand() *cobra.Command {
	f := benchFlags{agent: bench.DefaultAgentConfig(), mooncake: bench.MooncakeConfig{BlockScale: 1, OutputScale: 1}}
	simCfg := bench.DemoSim()
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Replay a multi-turn workload against routers and compare cache hit rate, TTFT and balance",
		Long: `bench replays one workload against one or more targets and reports, per target, the
prompt-cache hit rate (Σ cached_tokens / Σ prompt_tokens, and the workers' own counters when
known), TTFT p50/p90/p99, E2E p50/p99, throughput, errors, the router's decision labels, each
worker's share of requests and the in-flight imbalance across workers.

Targets are external endpoints (--target NAME=URL; several comma-separated URLs are used
round-robin) or routers bench starts itself in front of its own simulated workers, one per
entry of --policies, with the workers' caches emptied between runs. The entry haproxy puts HAProxy
(haproxy on PATH) in front of the same workers instead of a router: round robin with a stick
table on x-session-id (haproxy:none balances every request). A --policies entry may carry
a session id mode (cache_aware:none runs cache_aware without session ids) and a name
(engine=cache_aware). --router-arg passes router flags to every in-process router, or with
ENTRY=--flag=value to the entry named ENTRY only (the bench owns the listen address, workers,
policy, session store and discovery flags). --replicas N runs N routers per entry in front of the
same workers, taking the requests round-robin and sharing their session map through a
redis-server the bench starts on a loopback port (redis-server must be on PATH); an entry given
--router-arg ENTRY=--session-store=memory keeps a session map per replica instead.

Beside the hit rate the report gives "predicted": the share of prompt tokens the router expected
its worker to hold (x-vllm-router-prefix-match × prompt tokens), n/a for routers without it.

Workloads: agent (generated multi-turn agent sessions), mooncake (a Mooncake JSONL trace given
with --input), conversations (vLLM multi-turn benchmark JSON given with --input) and cctrace
(hash-only agent session traces in kv-cache-tester's format, real Claude Code sessions: --input
is a directory of their JSON files, or one file; each trace block becomes one KV block of
--block-size tokens, sub-agents are sessions of their own, --think-scale scales the pauses
(capped at --max-think first),
--max-blocks ends a session before its first longer request, --sessions N draws N files by
--seed). With cctrace the report gives the trace's reuse ceiling (the hit rate of one infinite
cache) and, for --policies, the KV oversubscription achieved; --kv-oversubscription X sizes the
simulated workers' KV caches so that the sessions in progress need X times what they hold.

--fronts measures what a front costs rather than what its placement is worth: the workload goes
to one simulated worker direct and through each front in turn (HAProxy, nginx, or a router run as
a process of this binary), and the report gives each front's added TTFT and E2E, paired per
request with direct, its CPU per request from /proc and its router's /tokenize outcomes.
--min-prompt-bytes and --max-prompt-bytes pick cctrace and mooncake requests by size.

--api chooses how each turn is sent: chat (/v1/chat/completions), responses (/v1/responses,
the whole conversation every turn), responses-chain (/v1/responses with previous_response_id and
only the turn's new input; the report adds the 404 "response not found" count and the share of
later turns on the previous turn's worker) or messages (Anthropic's /v1/messages).`,
		Example: `  cacheroute bench --policies round_robin,consistent_hash,cache_aware:none,cache_aware
  cacheroute bench --policies requests=cache_aware,engine=cache_aware --router-arg engine=--load-signal=engine
  cacheroute bench --replicas 2 --policies redis=cache_aware,memory=cache_aware --router-arg memory=--session-store=memory
  cacheroute bench --target router=http://127.0.0.1:30000 --worker-metrics http://127.0.0.1:8000,http://127.0.0.1:8001
  cacheroute bench --workload mooncake --input conversation_trace.jsonl --limit 2000 --block-scale 0.0625 --speedup 0 --policies cache_aware
  cacheroute bench --workload cctrace --input /tmp/cctrace/cc_traces_v6_global --sessions 100 --max-blocks 2048 --kv-oversubscription 3 --concurrency 32 --policies round_robin,cache_aware
  cacheroute bench --api responses-chain --policies round_robin,cache_aware
  cacheroute bench --workload cctrace --input /tmp/cctrace/cc_traces_v6_global --sessions 200 --min-prompt-bytes 80000 --max-prompt-bytes 120000 --block-size 112 --concurrency 1 --time-scale 1 --prefill-time-per-token 0 --output-tokens 16 --fronts direct,haproxy,nginx,cache_aware,cache_aware:none,cache_aware:none+events
  cacheroute bench --target two-replicas=http://127.0.0.1:30000,http://127.0.0.1:30001 --out-json run.json`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			f.sessionsSet = cmd.Flags().Changed("sessions")
			opts, err := f.options(simCfg)
			if err != nil {
				return err
			}
			if !f.quiet {
				opts.Progress = bench.NewProgress(cmd.ErrOrStderr(), bench.IsTerminal(os.Stderr))
			}
			ctx, stop := interruptible(cmd.Context())
			defer stop()
			if err := f.profiles.start(); err != nil {
				return err
			}
			rep, err := bench.Run(ctx, opts)
			if perr := f.profiles.stop(); perr != nil && err == nil {
				err = perr
			}
			if rep != nil && len(rep.Targets) > 0 {
				if werr := writeReport(cmd.OutOrStdout(), rep, f.outJSON, f.outMD, f.outChart); werr != nil && err == nil {
					err = werr
				}
			}
			return err
		},
	}
	fs := cmd.Flags()
	fs.SortFlags = false
	fs.StringVar(&f.workload, "workload", "agent", "agent, mooncake, conversations or cctrace")
	fs.IntVar(&f.agent.Sessions, "sessions", f.agent.Sessions, "agent: sessions; cctrace: trace files (sessions, each with its sub-agents) drawn by --seed (default: all)")
	fs.IntVar(&f.agent.Turns, "turns", f.agent.Turns, "agent: turns per session")
	fs.IntVar(&f.agent.SharedPrefixTokens, "shared-prefix-tokens", f.agent.SharedPrefixTokens, "agent: system prompt plus tool schemas, in tokens")
	fs.IntVar(&f.agent.ToolSets, "tool-sets", f.agent.ToolSets, "agent: tool-set variants sessions choose from")
	fs.IntVar(&f.agent.TaskTokens, "task-tokens", f.agent.TaskTokens, "agent: each session's own task text, in tokens")
	fs.StringVar(&f.toolResult, "tool-result-dist", f.agent.ToolResult.String(), "agent: tool result size in tokens: fixed:N, uniform:MIN,MAX or lognormal:MEDIAN,SIGMA")
	fs.IntVar(&f.agent.OutputTokens, "output-tokens", f.agent.OutputTokens, "agent, conversations: max_tokens of every request")
	fs.DurationVar(&f.agent.Think, "think-time", f.agent.Think, "agent, conversations: pause between a response and the session's next turn")
	fs.Uint64Var(&f.agent.Seed, "seed", f.agent.Seed, "agent: seed of the generated workload; cctrace: of the files drawn")
	fs.StringVar(&f.input, "input", "", "mooncake: the JSONL trace; conversations: the JSON file; cctrace: a directory of trace files, or one")
	fs.Float64Var(&f.cctrace.ThinkScale, "think-scale", 0, "cctrace: factor on the trace's pauses between a session's requests; 0 sends them back to back")
	fs.DurationVar(&f.cctrace.MaxThink, "max-think", 0, "cctrace: cap every pause at this much of the trace's time before --think-scale (0: no cap; some sessions pause for days)")
	fs.IntVar(&f.cctrace.MaxBlocks, "max-blocks", 0, "cctrace: end a session before its first request of more trace blocks (0: no limit)")
	fs.Float64Var(&f.mooncake.BlockScale, "block-scale", f.mooncake.BlockScale, "mooncake: scale of the 512-token blocks (0.0625 = 32 tokens)")
	fs.Float64Var(&f.mooncake.OutputScale, "output-scale", f.mooncake.OutputScale, "mooncake: scale of output_length")
	fs.Float64Var(&f.mooncake.Speedup, "speedup", f.mooncake.Speedup, "mooncake: divide timestamps by this; 0 replays closed-loop")
	fs.IntVar(&f.mooncake.Limit, "limit", 0, "mooncake, conversations, cctrace: at most this many requests (conversations: conversations); 0 for all")
	fs.IntVar(&f.mooncake.Offset, "offset", 0, "mooncake: skip this many requests first")
	fs.StringVar(&f.sessionMode, "session-id", bench.SessionHeader, "send the session id as header (x-session-id), body (session_params.session_id) or none; see docs/benchmarks.md for --api responses and messages")
	fs.StringVar(&f.api, "api", bench.APIChat, "send each turn as chat, responses, responses-chain or messages")

	fs.StringArrayVar(&f.targets, "target", nil, "NAME=URL[,URL...]: an endpoint to bench; several URLs are used round-robin (repeatable)")
	fs.StringSliceVar(&f.policies, "policies", nil, "start simulated workers and one in-process router per entry: [NAME=]POLICY[:header|body|none]")
	fs.StringSliceVar(&f.fronts, "fronts", nil, "send the workload to one simulated worker direct and through each front in turn, and report what each adds per request (paired with direct) and its CPU per request: [NAME=]FRONT[:header|body|none][+events], FRONT one of direct (required), haproxy, nginx or a router policy (run as a process of this binary; +events subscribes it to the worker's KV-cache events); each request's max_tokens capped at --output-tokens")
	fs.IntVar(&f.frontRound, "front-round", 20, "--fronts: the fronts take turns on rounds of whole sessions of at least this many requests, the worker emptied before each (0: the whole workload through each front in turn)")
	fs.IntVar(&f.minPromptBytes, "min-prompt-bytes", 0, "cctrace, mooncake: send only the requests whose messages weigh at least this many bytes as JSON")
	fs.IntVar(&f.maxPromptBytes, "max-prompt-bytes", 0, "cctrace, mooncake: send only the requests whose messages weigh at most this many bytes as JSON (0: no bound)")
	fs.StringArrayVar(&f.routerArgs, "router-arg", nil, "--policies, --fronts: a router flag for every in-process router (--load-signal=engine), or ENTRY=FLAG for the entry named ENTRY only; values as --flag=value (repeatable)")
	fs.IntVar(&f.replicas, "replicas", 1, "--policies: routers per entry, in front of the same workers, taking requests round-robin; above 1 they share sessions through a redis-server the bench starts (needs redis-server on PATH)")
	fs.IntVar(&f.workers, "workers", bench.DemoWorkers, "--policies: simulated workers")
	fs.IntVar(&f.prefillWorkers, "prefill-workers", 0, "--policies, with --decode-workers: run every entry colocated over prefill+decode workers, then as a P/D fleet (entry/pd) of that many prefill workers")
	fs.IntVar(&f.decodeWorkers, "decode-workers", 0, "--policies, with --prefill-workers: the P/D fleet's decode workers")
	fs.IntVar(&simCfg.MaxNumBatchedTokens, "max-num-batched-tokens", simCfg.MaxNumBatchedTokens, "--policies: the workers' step token budget; prompt tokens computed beside a decode step lengthen it (0: never)")
	fs.BoolVar(&f.kvEvents, "kv-events", true, "--policies: the simulated workers publish their KV-cache events and the routers subscribe (each worker on a loopback port of its own); --kv-events=false routes on the routers' own picture alone")
	fs.IntVar(&simCfg.KVCacheBlocks, "kv-cache-blocks", simCfg.KVCacheBlocks, "--policies: KV cache capacity per worker, in blocks")
	fs.Float64Var(&f.oversubscribe, "kv-oversubscription", 0, "--policies, cctrace: size the workers' KV caches (instead of --kv-cache-blocks) so that --concurrency sessions' mean working set is this many times the fleet's KV")
	fs.IntVar(&simCfg.BlockSize, "block-size", simCfg.BlockSize, "--policies: tokens per KV block")
	fs.IntVar(&simCfg.MaxNumSeqs, "max-num-seqs", simCfg.MaxNumSeqs, "--policies: requests a worker runs at once")
	fs.DurationVar(&simCfg.PrefillOverhead, "prefill-overhead", simCfg.PrefillOverhead, "--policies: fixed time of every prefill")
	fs.DurationVar(&simCfg.PrefillTimePerToken, "prefill-time-per-token", simCfg.PrefillTimePerToken, "--policies: prefill time per uncached prompt token")
	fs.DurationVar(&simCfg.InterTokenLatency, "inter-token-latency", simCfg.InterTokenLatency, "--policies: time between output tokens")
	fs.Float64Var(&simCfg.TimeScale, "time-scale", simCfg.TimeScale, "--policies: the workers sleep this fraction of every simulated duration; reports are at full scale")
	fs.StringSliceVar(&f.workerMetrics, "worker-metrics", nil, "--target: worker base URLs whose /metrics give cache counters and in-flight loads")
	fs.Float64Var(&f.targetTimeScale, "target-time-scale", 1, "--target: time scale of simulated workers behind the targets (1 for real workers)")

	fs.StringVar(&f.model, "model", "", "model name to request (default: the simulated model, or the first a target lists)")
	fs.IntVar(&f.concurrency, "concurrency", bench.DemoConcurrency, "sessions at once (closed loop) or requests at once (paced)")
	fs.DurationVar(&f.timeout, "request-timeout", 10*time.Minute, "timeout of one request")
	fs.StringVar(&f.outJSON, "out-json", "", "write the report as JSON to this file")
	fs.StringVar(&f.outMD, "out-md", "", "write the report as a Markdown table to this file")
	fs.StringVar(&f.outChart, "out-chart", "", "write a chart of hit rate and TTFT per target to this .svg file")
	fs.BoolVar(&f.quiet, "quiet", false, "no progress on stderr")
	fs.StringVar(&f.profiles.cpu, "cpu-profile", "", "write the run's CPU profile (routers and simulated workers together) to this file")
	fs.StringVar(&f.profiles.allocs, "allocs-profile", "", "write the run's allocation profile to this file")
	return cmd
}

// options turns the flags into bench options.
func (f *benchFlags) options(simCfg sim.Config) (bench.Options, error) {
	o := bench.Options{Workers: f.workers, Replicas: f.replicas, KVEvents: f.kvEvents, KVOversubscription: f.oversubscribe, PrefillWorkers: f.prefillWorkers, DecodeWorkers: f.decodeWorkers, Sim: simCfg, SessionMode: f.sessionMode, WorkerMetrics: f.workerMetrics,
		TargetTimeScale: f.targetTimeScale, API: f.api, Model: f.model, Concurrency: f.concurrency, Timeout: f.timeout}
	if !slices.Contains(bench.SessionModes, f.sessionMode) {
		return o, fmt.Errorf("--session-id %q: want one of %s", f.sessionMode, strings.Join(bench.SessionModes, ", "))
	}
	if !slices.Contains(bench.APIs, f.api) {
		return o, fmt.Errorf("--api %q: want one of %s", f.api, strings.Join(bench.APIs, ", "))
	}
	if f.outChart != "" && strings.ToLower(filepath.Ext(f.outChart)) != ".svg" {
		return o, fmt.Errorf("--out-chart %s: only .svg charts are written", f.outChart)
	}
	if f.targetTimeScale <= 0 {
		return o, fmt.Errorf("--target-time-scale must be positive")
	}
	var err error
	if o.Policies, err = bench.ParsePolicies(f.policies, f.sessionMode); err != nil {
		return o, err
	}
	if o.Fronts, err = bench.ParseFronts(f.fronts, f.sessionMode); err != nil {
		return o, err
	}
	if len(o.Fronts) > 0 {
		if len(o.Policies) > 0 || len(f.targets) > 0 {
			return o, fmt.Errorf("--fronts runs alone: not with --policies or --target")
		}
		if err := bench.ApplyFrontRouterArgs(o.Fronts, f.routerArgs); err != nil {
			return o, err
		}
		exe, err := os.Executable()
		if err != nil {
			return o, fmt.Errorf("--fronts starts routers from this program: %w", err)
		}
		o.RouterCommand = []string{exe}
		if f.frontRound < 0 {
			return o, fmt.Errorf("--front-round must not be negative")
		}
		o.FrontRound = f.frontRound
	} else {
		if len(f.routerArgs) > 0 && len(o.Policies) == 0 {
			return o, fmt.Errorf("--router-arg configures the in-process routers of --policies; with --target, pass flags to your own routers")
		}
		if err := bench.ApplyRouterArgs(o.Policies, f.routerArgs); err != nil {
			return o, err
		}
	}
	if f.replicas < 1 {
		return o, fmt.Errorf("--replicas must be at least 1, got %d", f.replicas)
	}
	for _, t := range f.targets {
		spec, err := bench.ParseTarget(t)
		if err != nil {
			return o, err
		}
		o.Targets = append(o.Targets, spec)
	}
	if len(o.Policies) == 0 && len(o.Targets) == 0 && len(o.Fronts) == 0 {
		return o, fmt.Errorf("give --policies (in-process routers and simulated workers) or --target NAME=URL; try: cacheroute bench --policies %s", strings.Join(bench.DemoPolicies, ","))
	}
	if len(o.Policies) > 0 || len(o.Fronts) > 0 {
		if err := simCfg.Validate(); err != nil {
			return o, err
		}
	}
	if f.oversubscribe < 0 {
		return o, fmt.Errorf("--kv-oversubscription must not be negative")
	}
	if o.Workload, o.Params, err = f.buildWorkload(simCfg.BlockSize); err != nil {
		return o, err
	}
	return o, f.selectRequests(&o)
}

// selectRequests keeps the requests of the size asked (--min-prompt-bytes, --max-prompt-bytes,
// and --limit for cctrace), and with --fronts caps every request's output at --output-tokens.
func (f *benchFlags) selectRequests(o *bench.Options) error {
	limit := 0
	if f.workload == "cctrace" {
		limit = f.mooncake.Limit
	}
	if f.minPromptBytes != 0 || f.maxPromptBytes != 0 || limit != 0 {
		if err := o.Workload.SelectRequests(f.minPromptBytes, f.maxPromptBytes, limit); err != nil {
			return fmt.Errorf("--min-prompt-bytes, --max-prompt-bytes, --limit: %w", err)
		}
		o.Params["min_prompt_bytes"], o.Params["max_prompt_bytes"], o.Params["limit"] = f.minPromptBytes, f.maxPromptBytes, limit
	}
	if len(o.Fronts) > 0 {
		if f.agent.OutputTokens < 1 {
			return fmt.Errorf("--output-tokens must be at least 1, got %d", f.agent.OutputTokens)
		}
		o.Workload.CapOutputTokens(f.agent.OutputTokens)
		o.Params["output_tokens"] = f.agent.OutputTokens
	}
	return nil
}

// buildWorkload generates or loads the workload and records its parameters. blockSize is the
// simulated workers' block size, the tokens of each block of a cctrace replay.
func (f *benchFlags) buildWorkload(blockSize int) (bench.Workload, map[string]any, error) {
	switch f.workload {
	case "agent":
		d, err := bench.ParseDist(f.toolResult)
		if err != nil {
			return bench.Workload{}, nil, fmt.Errorf("--tool-result-dist: %w", err)
		}
		f.agent.ToolResult = d
		w, err := bench.Agent(f.agent)
		return w, map[string]any{"sessions": f.agent.Sessions, "turns": f.agent.Turns, "shared_prefix_tokens": f.agent.SharedPrefixTokens,
			"tool_sets": f.agent.ToolSets, "task_tokens": f.agent.TaskTokens, "tool_result_dist": d.String(),
			"output_tokens": f.agent.OutputTokens, "think_time": f.agent.Think.String(), "seed": f.agent.Seed}, err
	case "mooncake", "conversations":
		if f.input == "" {
			return bench.Workload{}, nil, fmt.Errorf("--workload %s needs --input FILE", f.workload)
		}
		file, err := os.Open(f.input)
		if err != nil {
			return bench.Workload{}, nil, err
		}
		defer file.Close()
		if f.workload == "conversations" {
			w, err := bench.Conversations(file, bench.ConversationsConfig{OutputTokens: f.agent.OutputTokens, Think: f.agent.Think, Limit: f.mooncake.Limit})
			return w, map[string]any{"input": filepath.Base(f.input), "output_tokens": f.agent.OutputTokens, "limit": f.mooncake.Limit}, err
		}
		recs, err := bench.ReadMooncake(file, f.mooncake.Offset, f.mooncake.Limit)
		if err != nil {
			return bench.Workload{}, nil, err
		}
		w, err := bench.Mooncake(recs, f.mooncake)
		return w, map[string]any{"input": filepath.Base(f.input), "offset": f.mooncake.Offset, "limit": f.mooncake.Limit,
			"block_scale": f.mooncake.BlockScale, "output_scale": f.mooncake.OutputScale, "speedup": f.mooncake.Speedup}, err
	case "cctrace":
		if f.input == "" {
			return bench.Workload{}, nil, fmt.Errorf("--workload cctrace needs --input DIR (the trace files, unpacked)")
		}
		draw := 0
		if f.sessionsSet {
			draw = f.agent.Sessions
		}
		files, err := bench.ReadCCTraces(f.input, draw, f.agent.Seed)
		if err != nil {
			return bench.Workload{}, nil, err
		}
		c := f.cctrace
		c.BlockTokens = blockSize
		w, err := bench.CCTrace(files, c)
		return w, map[string]any{"input": filepath.Base(f.input), "files": len(files), "seed": f.agent.Seed,
			"block_tokens": c.BlockTokens, "think_scale": c.ThinkScale, "max_think": c.MaxThink.String(), "max_blocks": c.MaxBlocks, "kv_oversubscription": f.oversubscribe}, err
	default:
		return bench.Workload{}, nil, fmt.Errorf("--workload %q: want agent, mooncake, conversations or cctrace", f.workload)
	}
}

// writeReport prints the table on out and writes the files asked for.
func writeReport(out io.Writer, rep *bench.Report, jsonPath, mdPath, chartPath string) error {
	if err := bench.WriteTable(out, rep); err != nil {
		return err
	}
	for _, o := range []struct {
		path  string
		write func(io.Writer, *bench.Report) error
	}{{jsonPath, bench.WriteJSON}, {mdPath, bench.WriteMarkdown}, {chartPath, bench.WriteSVG}} {
		if o.path == "" {
			continue
		}
		if err := writeFile(o.path, func(w io.Writer) error { return o.write(w, rep) }); err != nil {
			return err
		}
		fmt.Fprintf(out, "wrote %s\n", o.path)
	}
	return nil
}

// writeFile writes a file through fn and reports the first error, closing included.
func writeFile(path string, fn func(io.Writer) error) error {
	file, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := fn(file); err != nil {
		file.Close()
		return err
	}
	return file.Close()
}

// interruptible returns a context cancelled by SIGINT or SIGTERM.
func interruptible(parent context.Context) (context.Context, context.CancelFunc) {
	return signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
}
