package sim

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Failure modes for Config.FailureMode.
const (
	FailHTTP500 = "500"   // answer 500 with a vLLM-style error body
	FailReset   = "reset" // close the connection without an answer
	FailStall   = "stall" // stop mid-stream and hold the request until the client leaves
	FailSlow    = "slow"  // serve the request ten times slower
)

// Values of Config.OutputLenDist.
const (
	OutputLenExponential = "exponential" // 1 + an exponential draw: many short replies, a few long
	OutputLenUniform     = "uniform"     // uniform over 1 .. 2×mean−1
	OutputLenFixed       = "fixed"       // always the mean
)

// slowFactor multiplies prefill and inter-token time in FailSlow mode.
const slowFactor = 10

// Config describes one simulated worker. DefaultConfig returns the values
// `cacheroute sim` starts with.
type Config struct {
	// Models are the served model names; the first one labels the metrics.
	Models []string
	// BlockSize is the number of tokens per KV block.
	BlockSize int
	// KVCacheBlocks is the KV capacity in blocks.
	KVCacheBlocks int
	// MaxNumSeqs is the number of requests that run at once; the rest wait
	// in arrival order.
	MaxNumSeqs int
	// PrefillOverhead is the fixed part of every prefill.
	PrefillOverhead time.Duration
	// PrefillTimePerToken is charged for every prompt token the cache misses.
	PrefillTimePerToken time.Duration
	// InterTokenLatency separates consecutive output tokens.
	InterTokenLatency time.Duration
	// TimeScale multiplies every duration the worker sleeps; 0 never sleeps.
	TimeScale float64
	// DefaultMaxTokens is the output length of a request that sets none.
	DefaultMaxTokens int
	// OutputLenDist is how a reply's natural length (where the model would
	// emit end-of-sequence) is drawn: OutputLenExponential, OutputLenUniform
	// or OutputLenFixed. A reply stops there ("stop", "end_turn") when that
	// comes before the request's max tokens, and at max tokens ("length",
	// "max_tokens") otherwise; ignore_eos always runs to max tokens. So an
	// agent that asks a large max_tokens (Claude Code asks 32000) gets an
	// answer of about OutputLenMean tokens, as from a real model.
	OutputLenDist string
	// OutputLenMean is the mean natural reply length in tokens.
	OutputLenMean int
	// ToolCallRate is the chance that a reply whose tool choice leaves the
	// model free calls a tool, when it answers the user's own message (see
	// the tool-call rule in toolcall.go). 0 never calls unless forced.
	ToolCallRate float64
	// ToolCallDecay multiplies that chance once per round of tool calls since
	// the user's last message, so a tool loop ends; 0 answers every tool
	// result with text.
	ToolCallDecay float64
	// ToolPick is which offered tools a call may use: ToolPickReadOnly
	// (tools whose names say they only read; no call when none is offered)
	// or ToolPickAny. A harness runs the calls it gets, so the default calls
	// nothing that could change anything.
	ToolPick string
	// FailureRate is the fraction of generation requests that fail.
	FailureRate float64
	// FailureMode is one of FailHTTP500, FailReset, FailStall, FailSlow.
	FailureMode string
	// MaxModelLen is the context length in tokens; a prompt that leaves no
	// room for one output token is refused with 400.
	MaxModelLen int
	// Seed seeds the output text and the failure draws.
	Seed int64
	// LoRAModules are the LoRA adapters served from the start (vLLM's --lora-modules); more
	// can be loaded at run time (lora.go).
	LoRAModules []LoRAModule
	// MaxLoRAs bounds the adapters served at once, those given at start and those loaded
	// since; a load past it is refused. 0 means DefaultMaxLoRAs.
	MaxLoRAs int
	// KVEvents, when its endpoint is set, publishes the cache's KV-cache events (kvevents.go).
	KVEvents KVEventsConfig

	// MaxNumBatchedTokens is the engine step's token budget (vLLM's
	// --max-num-batched-tokens with chunked prefill): while prompts are being
	// computed, every decode step of the other running requests also carries
	// up to this many of their tokens, and takes PrefillTimePerToken longer
	// per token. It is why prefill/decode disaggregation pays. 0 keeps decode
	// steps at InterTokenLatency whatever else runs.
	MaxNumBatchedTokens int
	// KVTransferTimePerToken is what a decode leg pays per prompt token it
	// pulls from a prefill worker instead of computing it (pd.go).
	KVTransferTimePerToken time.Duration
	// KVTransferHold is how long a prefill leg's blocks stay pinned for the
	// decode worker that has not pulled them yet.
	KVTransferHold time.Duration
	// KVLoadFailurePolicy is what a decode leg does when its prefill worker's
	// blocks are gone: KVLoadFail answers 500 (vLLM's default), KVLoadRecompute
	// computes the prompt itself.
	KVLoadFailurePolicy string

	// Clock tells time and sleeps; nil means the wall clock. Tests pass a
	// *ManualClock to observe queueing in simulated time.
	Clock Clock
}

// DefaultConfig returns the defaults of `cacheroute sim`.
func DefaultConfig() Config {
	return Config{
		Models:              []string{"sim-model"},
		BlockSize:           16,
		KVCacheBlocks:       8192,
		MaxNumSeqs:          8,
		PrefillOverhead:     5 * time.Millisecond,
		PrefillTimePerToken: 100 * time.Microsecond,
		InterTokenLatency:   5 * time.Millisecond,
		TimeScale:           1,
		DefaultMaxTokens:    16,
		OutputLenDist:       OutputLenExponential,
		OutputLenMean:       64,
		ToolCallRate:        0.5,
		ToolCallDecay:       0.5,
		ToolPick:            ToolPickReadOnly,
		FailureRate:         0,
		FailureMode:         FailHTTP500,
		MaxModelLen:         131072,
		Seed:                0,
		MaxLoRAs:            DefaultMaxLoRAs,

		KVTransferTimePerToken: 10 * time.Microsecond,
		KVTransferHold:         30 * time.Second,
		KVLoadFailurePolicy:    KVLoadFail,
	}
}

// Validate reports every setting that is out of range, joined.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if len(c.Models) == 0 {
		bad("at least one model name is required")
	}
	seen := make(map[string]bool, len(c.Models))
	for _, m := range c.Models {
		switch {
		case m == "":
			bad("model name must not be empty")
		case seen[m]:
			bad("model %q given twice", m)
		}
		seen[m] = true
	}
	if c.BlockSize < 1 {
		bad("block size %d must be at least 1", c.BlockSize)
	}
	if c.KVCacheBlocks < 1 {
		bad("kv cache blocks %d must be at least 1", c.KVCacheBlocks)
	}
	if c.MaxNumSeqs < 1 {
		bad("max num seqs %d must be at least 1", c.MaxNumSeqs)
	}
	if c.PrefillOverhead < 0 || c.PrefillTimePerToken < 0 || c.InterTokenLatency < 0 {
		bad("latencies must not be negative")
	}
	if c.TimeScale < 0 || math.IsNaN(c.TimeScale) || math.IsInf(c.TimeScale, 0) {
		bad("time scale %v must be a finite number >= 0", c.TimeScale)
	}
	if c.DefaultMaxTokens < 1 {
		bad("default max tokens %d must be at least 1", c.DefaultMaxTokens)
	}
	switch c.OutputLenDist {
	case OutputLenExponential, OutputLenUniform, OutputLenFixed:
	default:
		bad("output length distribution %q must be one of exponential, uniform, fixed", c.OutputLenDist)
	}
	if c.OutputLenMean < 1 {
		bad("output length mean %d must be at least 1", c.OutputLenMean)
	}
	if !(c.ToolCallRate >= 0 && c.ToolCallRate <= 1) {
		bad("tool call rate %v must be between 0 and 1", c.ToolCallRate)
	}
	if !(c.ToolCallDecay >= 0 && c.ToolCallDecay <= 1) {
		bad("tool call decay %v must be between 0 and 1", c.ToolCallDecay)
	}
	switch c.ToolPick {
	case ToolPickReadOnly, ToolPickAny:
	default:
		bad("tool pick %q must be one of read-only, any", c.ToolPick)
	}
	if !(c.FailureRate >= 0 && c.FailureRate <= 1) {
		bad("failure rate %v must be between 0 and 1", c.FailureRate)
	}
	switch c.FailureMode {
	case FailHTTP500, FailReset, FailStall, FailSlow:
	default:
		bad("failure mode %q must be one of 500, reset, stall, slow", c.FailureMode)
	}
	if c.MaxNumBatchedTokens < 0 {
		bad("max num batched tokens %d must not be negative", c.MaxNumBatchedTokens)
	}
	if c.KVTransferTimePerToken < 0 || c.KVTransferHold < 0 {
		bad("kv transfer time per token and hold must not be negative")
	}
	switch c.KVLoadFailurePolicy {
	case KVLoadFail, KVLoadRecompute:
	default:
		bad("kv load failure policy %q must be one of fail, recompute", c.KVLoadFailurePolicy)
	}
	if c.MaxModelLen < 2 {
		bad("max model len %d must be at least 2", c.MaxModelLen)
	}
	if err := c.validateLoRAs(); err != nil {
		errs = append(errs, err)
	}
	if err := c.KVEvents.validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
