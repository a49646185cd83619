package cli

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/cacheroute/cacheroute/internal/sim"
)

// simShutdownGrace bounds how long `cacheroute sim` waits for running
// requests after SIGINT or SIGTERM.
const simShutdownGrace = 5 * time.Second

// newSimCommand returns `cacheroute sim`: one or more simulated vLLM workers
// in one process, on consecutive ports.
func newSimCommand() *cobra.Command {
	cfg := sim.DefaultConfig()
	host, port, workers := "127.0.0.1", 8000, 1
	cmd := &cobra.Command{
		Use:   "sim",
		Short: "Run simulated vLLM workers (prefix cache, latency, queueing, vLLM metrics)",
		Long: `sim serves the OpenAI-compatible API of a vLLM worker without a GPU. Each worker models
vLLM's automatic prefix caching over KV blocks, a FIFO scheduler with --max-num-seqs running
requests, and a latency model: TTFT = queue + prefill overhead + uncached tokens × per-token
time, then one token per inter-token latency. It exports vLLM's metric names on /metrics.

With --workers N it starts N independent workers on ports port .. port+N-1.`,
		Example: `  cacheroute sim --workers 2 --port 8000
  cacheroute sim --time-scale 0 --kv-cache-blocks 1024 --max-num-seqs 16
  cacheroute sim --failure-rate 0.05 --failure-mode reset`,
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if workers < 1 {
				return fmt.Errorf("--workers %d must be at least 1", workers)
			}
			if port < 0 || port+workers-1 > 65535 || (port == 0 && workers > 1) {
				return fmt.Errorf("--port %d with --workers %d does not fit in 1..65535", port, workers)
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			addrs := make([]string, workers)
			for i := range addrs {
				addrs[i] = net.JoinHostPort(host, strconv.Itoa(port+i))
			}
			log := slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			return runSim(ctx, log, addrs, cfg)
		},
	}
	f := cmd.Flags()
	f.SortFlags = false
	f.StringVar(&host, "host", host, "listen host")
	f.IntVar(&port, "port", port, "listen port of the first worker")
	f.IntVar(&workers, "workers", workers, "number of independent workers, on ports port .. port+N-1")
	f.StringSliceVar(&cfg.Models, "model", cfg.Models, "served model name (repeat or comma-separate for several; the first labels the metrics)")
	f.Var(loraModulesFlag{&cfg.LoRAModules}, "lora-modules", "a LoRA adapter to serve, as vLLM's --lora-modules: name=path or {\"name\": ..., \"path\": ..., \"base_model_name\": ...} (repeat for several)")
	f.IntVar(&cfg.MaxLoRAs, "max-loras", cfg.MaxLoRAs, "the most LoRA adapters a worker serves at once, given at start or loaded by POST /v1/load_lora_adapter; a load past it is refused with 400")
	f.IntVar(&cfg.BlockSize, "block-size", cfg.BlockSize, "tokens per KV block")
	f.IntVar(&cfg.KVCacheBlocks, "kv-cache-blocks", cfg.KVCacheBlocks, "KV cache capacity in blocks")
	f.IntVar(&cfg.MaxNumSeqs, "max-num-seqs", cfg.MaxNumSeqs, "requests running at once; the rest wait in arrival order")
	f.DurationVar(&cfg.PrefillOverhead, "prefill-overhead", cfg.PrefillOverhead, "fixed time of every prefill")
	f.DurationVar(&cfg.PrefillTimePerToken, "prefill-time-per-token", cfg.PrefillTimePerToken, "prefill time per prompt token not in the cache")
	f.DurationVar(&cfg.InterTokenLatency, "inter-token-latency", cfg.InterTokenLatency, "time between output tokens")
	f.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "multiplies every simulated duration slept (0: never sleep)")
	f.IntVar(&cfg.DefaultMaxTokens, "default-max-tokens", cfg.DefaultMaxTokens, "output length when a request sets no max_tokens")
	f.StringVar(&cfg.OutputLenDist, "output-len-dist", cfg.OutputLenDist, "distribution of a reply's natural length, where it stops before max_tokens: exponential, uniform (1..2x mean), fixed")
	f.IntVar(&cfg.OutputLenMean, "output-len-mean", cfg.OutputLenMean, "mean natural reply length in tokens (ignore_eos runs to max_tokens)")
	f.Float64Var(&cfg.ToolCallRate, "tool-call-rate", cfg.ToolCallRate, "chance that a reply to the user's message calls an offered tool when tool_choice does not force one")
	f.Float64Var(&cfg.ToolCallDecay, "tool-call-decay", cfg.ToolCallDecay, "multiplies that chance per round of tool calls since the user's message (0: a tool result always gets text)")
	f.StringVar(&cfg.ToolPick, "tool-pick", cfg.ToolPick, "tools a call may use: read-only (names like Read, Grep, get_*, list_*; none offered: no call) or any")
	f.Float64Var(&cfg.FailureRate, "failure-rate", cfg.FailureRate, "fraction of generation requests that fail")
	f.StringVar(&cfg.FailureMode, "failure-mode", cfg.FailureMode, "how they fail: 500, reset (close the connection), stall (stop mid-stream), slow (10x latency)")
	f.IntVar(&cfg.MaxModelLen, "max-model-len", cfg.MaxModelLen, "context length in tokens; longer prompts get 400")
	f.Int64Var(&cfg.Seed, "seed", cfg.Seed, "seed of the output text and the failure draws")
	f.IntVar(&cfg.MaxNumBatchedTokens, "max-num-batched-tokens", cfg.MaxNumBatchedTokens, "engine step token budget: while prompts are computed, each decode step of other requests carries up to this many of their tokens and takes --prefill-time-per-token longer per token (0: prefills never slow decodes)")
	f.DurationVar(&cfg.KVTransferTimePerToken, "kv-transfer-time-per-token", cfg.KVTransferTimePerToken, "a decode leg's cost per prompt token pulled from its prefill worker (requests with kv_transfer_params do_remote_prefill)")
	f.DurationVar(&cfg.KVTransferHold, "kv-transfer-hold", cfg.KVTransferHold, "how long a prefill leg's blocks stay pinned for a decode worker that has not pulled them (do_remote_decode)")
	f.StringVar(&cfg.KVLoadFailurePolicy, "kv-load-failure-policy", cfg.KVLoadFailurePolicy, "a decode leg whose prefill worker's blocks are gone: fail (answer 500, vLLM's default) or recompute (compute the prompt here)")
	f.StringVar(&cfg.KVEvents.Endpoint, "kv-events-endpoint", "", "publish KV-cache events in vLLM's format on this ZMQ PUB endpoint: bound when it has *, ::, ipc:// or inproc:// (tcp://*:5557), dialled otherwise; worker n uses port+n")
	f.StringVar(&cfg.KVEvents.ReplayEndpoint, "kv-events-replay-endpoint", "", "bind a ZMQ ROUTER here that replays buffered event batches (tcp://*:5558); worker n uses port+n")
	f.StringVar(&cfg.KVEvents.Topic, "kv-events-topic", "", "topic frame of every event message (vLLM's default: empty)")
	f.StringVar(&cfg.KVEvents.Encoding, "kv-events-encoding", "array", "event encoding: array (msgspec array_like, vLLM's default) or map (structs as maps tagged \"type\")")
	return cmd
}

// runSim serves workers on addrs until ctx ends or a server fails, then
// shuts them down, giving running requests simShutdownGrace to finish.
func runSim(ctx context.Context, log *slog.Logger, addrs []string, cfg sim.Config) error {
	fleet, err := sim.Start(addrs, cfg)
	if err != nil {
		return err
	}
	for _, u := range fleet.URLs() {
		log.Info("sim worker listening", "url", u, "models", cfg.Models, "block_size", cfg.BlockSize,
			"kv_cache_blocks", cfg.KVCacheBlocks, "max_num_seqs", cfg.MaxNumSeqs, "time_scale", cfg.TimeScale)
	}
	for _, w := range fleet.Workers() {
		if ev := w.Config().KVEvents; ev.Endpoint != "" {
			log.Info("sim worker publishing kv events", "endpoint", ev.Endpoint, "replay", ev.ReplayEndpoint, "topic", ev.Topic, "encoding", ev.Encoding)
		}
	}
	var serveErr error
	select {
	case <-ctx.Done():
		log.Info("sim shutting down", "workers", len(addrs))
	case serveErr = <-fleet.Err():
		log.Error("sim worker failed", "err", serveErr)
	}
	sctx, cancel := context.WithTimeout(context.Background(), simShutdownGrace)
	defer cancel()
	if err := fleet.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		serveErr = errors.Join(serveErr, err)
	}
	return serveErr
}

// loraModulesFlag is --lora-modules: each value one adapter, in either of vLLM's forms.
type loraModulesFlag struct{ mods *[]sim.LoRAModule }

func (f loraModulesFlag) String() string {
	if f.mods == nil {
		return ""
	}
	parts := make([]string, len(*f.mods))
	for i, m := range *f.mods {
		parts[i] = m.Name + "=" + m.Path
	}
	return strings.Join(parts, " ")
}

func (f loraModulesFlag) Set(s string) error {
	m, err := sim.ParseLoRAModule(s)
	if err != nil {
		return err
	}
	*f.mods = append(*f.mods, m)
	return nil
}

func (loraModulesFlag) Type() string { return "lora" }
