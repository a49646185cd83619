package cacheaware

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/policy/registry"
	"github.com/cacheroute/cacheroute/internal/residency"
)

// HistoryModes lists the accepted --history-match-mode values.
var HistoryModes = []string{HistoryCost, HistoryThreshold}

// Cache indexes, --cache-index: which picture of the workers' caches places a request without
// session key that came with its tokens.
const (
	IndexAuto   = "auto"   // the engines' events when one reports holding part of the prompt, else the prefix tree
	IndexEvents = "events" // the engines' events alone: a prompt no engine holds goes to the least loaded
	IndexText   = "text"   // the prefix tree alone, the events not routed on
)

// DefaultOffloadedBlockWeight is what an offloaded block is worth against a GPU one by default:
// it saves its prefill, but the engine first copies it back to the GPU (over PCIe from CPU
// memory, slower from disk), and an offloading tier evicts on its own terms.
const DefaultOffloadedBlockWeight = 0.5

// CacheIndexes lists the accepted --cache-index values.
var CacheIndexes = []string{IndexAuto, IndexEvents, IndexText}

// Knobs are the policy's flags, with their defaults from DefaultKnobs; the configuration binds
// and validates them through the registry (registry.Options).
type Knobs struct {
	CacheThreshold       float64
	BalanceAbsThreshold  int
	BalanceRelThreshold  float64
	HistoryMatchMode     string
	DisableCorrection    bool
	CacheIndex           string
	OffloadedBlockWeight float64
	MaxTreeSize          int
	EvictionIntervalSecs float64
	// KV pressure (pressure.go).
	KVPressure                  bool
	KVHeadroom                  float64
	SessionAdmission            bool
	SessionAdmissionTimeoutSecs float64
	SessionAdmissionQueueSize   int
}

// DefaultKnobs are the policy's defaults.
func DefaultKnobs() *Knobs {
	return &Knobs{
		CacheThreshold:       0.3,
		BalanceAbsThreshold:  64,
		BalanceRelThreshold:  1.5,
		HistoryMatchMode:     HistoryCost,
		CacheIndex:           IndexAuto,
		OffloadedBlockWeight: DefaultOffloadedBlockWeight,
		MaxTreeSize:          64 << 20,
		EvictionIntervalSecs: 120,

		KVPressure:                  true,
		KVHeadroom:                  residency.DefaultHeadroom,
		SessionAdmission:            true,
		SessionAdmissionTimeoutSecs: 120,
		SessionAdmissionQueueSize:   1024,
	}
}

// Bind registers the knobs as flags.
func (k *Knobs) Bind(fs *pflag.FlagSet) {
	fs.Float64Var(&k.CacheThreshold, "cache-threshold", k.CacheThreshold, "cache_aware: matched fraction of the history above which the holder is chosen")
	fs.IntVar(&k.BalanceAbsThreshold, "balance-abs-threshold", k.BalanceAbsThreshold, "cache_aware: load gate trips when max-min load exceeds this ...")
	fs.Float64Var(&k.BalanceRelThreshold, "balance-rel-threshold", k.BalanceRelThreshold, "cache_aware: ... and max exceeds min times this")
	fs.IntVar(&k.MaxTreeSize, "max-tree-size", k.MaxTreeSize, "cache_aware: heap bytes of the prefix tree, all models together (node overhead included)")
	fs.Float64Var(&k.EvictionIntervalSecs, "eviction-interval-secs", k.EvictionIntervalSecs, "cache_aware: seconds between tree and session sweeps")
	fs.StringVar(&k.HistoryMatchMode, "history-match-mode", k.HistoryMatchMode, "cache_aware: how a match below --cache-threshold counts: cost (the prefill it saves against the holder's load) or threshold (not at all)")
	fs.StringVar(&k.CacheIndex, "cache-index", k.CacheIndex, "cache_aware, with KV-cache events: what places a request without session id: auto (the engines' events when one holds part of the prompt, else the prefix tree), events (the events alone) or text (the prefix tree alone)")
	fs.Float64Var(&k.OffloadedBlockWeight, "kv-offloaded-block-weight", k.OffloadedBlockWeight, "cache_aware, with KV-cache events: what a block an engine holds offloaded (CPU, disk) is worth against one on its GPU, 0 to 1")
	fs.BoolVar(&k.KVPressure, "kv-pressure", k.KVPressure, "cache_aware: place the requests with a session id by what the workers' KV caches hold once their capacities are known (sessions stay while resident, new ones go where their working set fits, by predicted time to first token); false: the decision chain alone")
	fs.Float64Var(&k.KVHeadroom, "kv-headroom", k.KVHeadroom, "cache_aware, --kv-pressure: share of each worker's KV capacity kept free of live sessions' working sets, for their growth and for requests without a session, above 0 and below 1")
	fs.BoolVar(&k.SessionAdmission, "session-admission", k.SessionAdmission, "cache_aware, --kv-pressure: a session no worker has KV room for waits in the router for room (least attained service first) instead of making an engine evict a live session")
	fs.Float64Var(&k.SessionAdmissionTimeoutSecs, "session-admission-timeout-secs", k.SessionAdmissionTimeoutSecs, "cache_aware, --session-admission: the longest a session's request waits for KV room; then it is placed anyway")
	fs.IntVar(&k.SessionAdmissionQueueSize, "session-admission-queue-size", k.SessionAdmissionQueueSize, "cache_aware, --session-admission: requests that may wait for KV room at once; more are placed anyway")
	fs.BoolVar(&k.DisableCorrection, "disable-cache-correction", k.DisableCorrection, "cache_aware: keep predicting a worker holds what it was taught even when its answers report far fewer cached tokens (by default its older holds then stop counting)")
}

// Validate checks the knobs; each error names its flag.
func (k *Knobs) Validate() []error {
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	if !(k.EvictionIntervalSecs > 0) {
		bad("eviction-interval-secs", "must be positive, got %v", k.EvictionIntervalSecs)
	}
	if !(k.BalanceRelThreshold > 0) {
		bad("balance-rel-threshold", "must be positive, got %v", k.BalanceRelThreshold)
	}
	if k.MaxTreeSize < 1 {
		bad("max-tree-size", "must be at least 1, got %d", k.MaxTreeSize)
	}
	if k.BalanceAbsThreshold < 0 {
		bad("balance-abs-threshold", "must not be negative, got %d", k.BalanceAbsThreshold)
	}
	if k.CacheThreshold < 0 || k.CacheThreshold > 1 {
		bad("cache-threshold", "must be within [0, 1], got %v", k.CacheThreshold)
	}
	if !(k.OffloadedBlockWeight >= 0 && k.OffloadedBlockWeight <= 1) {
		bad("kv-offloaded-block-weight", "must be within [0, 1], got %v", k.OffloadedBlockWeight)
	}
	if !(k.KVHeadroom > 0 && k.KVHeadroom < 1) {
		bad("kv-headroom", "must be within (0, 1), got %v", k.KVHeadroom)
	}
	if !(k.SessionAdmissionTimeoutSecs > 0) {
		bad("session-admission-timeout-secs", "must be positive, got %v", k.SessionAdmissionTimeoutSecs)
	}
	if k.SessionAdmissionQueueSize < 1 {
		bad("session-admission-queue-size", "must be at least 1, got %d", k.SessionAdmissionQueueSize)
	}
	if !slices.Contains(CacheIndexes, k.CacheIndex) {
		bad("cache-index", "unknown index %q (want %s)", k.CacheIndex, strings.Join(CacheIndexes, ", "))
	}
	if !slices.Contains(HistoryModes, k.HistoryMatchMode) {
		bad("history-match-mode", "unknown mode %q (want %s)", k.HistoryMatchMode, strings.Join(HistoryModes, ", "))
	}
	return errs
}

// EvictionInterval is --eviction-interval-secs.
func (k *Knobs) EvictionInterval() time.Duration {
	return time.Duration(k.EvictionIntervalSecs * float64(time.Second))
}

// Options are the policy's options built from its knobs and the router's environment.
func (k *Knobs) Options(env policy.Env) Options {
	return Options{
		CacheThreshold:      k.CacheThreshold,
		BalanceAbsThreshold: k.BalanceAbsThreshold,
		BalanceRelThreshold: k.BalanceRelThreshold,
		HistoryMatchMode:    k.HistoryMatchMode,
		DisableCorrection:   k.DisableCorrection,
		CacheIndex:          k.CacheIndex,
		OffloadedWeight:     k.OffloadedBlockWeight,
		LoadUnitTokens:      env.LoadUnitTokens,
		MaxTreeSize:         k.MaxTreeSize,
		EvictionInterval:    k.EvictionInterval(),
		Store:               env.Store,
		SessionTTL:          env.SessionTTL,
		MaxSessions:         env.MaxSessions,
		KVIndex:             env.KVIndex,
		Tokenizer:           env.Tokenizer,
		Pressure:            k.pressure(),
	}
}

// pressure is the pressure-aware placement's options, nil when --kv-pressure is off.
func (k *Knobs) pressure() *PressureOptions {
	if !k.KVPressure {
		return nil
	}
	return &PressureOptions{
		Residency:        residency.Options{Headroom: k.KVHeadroom},
		Admission:        k.SessionAdmission,
		AdmissionTimeout: time.Duration(k.SessionAdmissionTimeoutSecs * float64(time.Second)),
		AdmissionQueue:   k.SessionAdmissionQueueSize,
	}
}

func init() {
	policy.Register(policy.Entry{
		Spec: registry.Spec{Name: Name, Default: true,
			Summary: "session affinity, then the longest cached prefix, then least load; a load-balance gate overrides affinity",
			Options: func() registry.Options { return DefaultKnobs() }},
		New: func(env policy.Env, o registry.Options) policy.Policy {
			return New(o.(*Knobs).Options(env), env.Reporter, env.Log)
		},
	})
}

// KnobsIn returns cache_aware's knobs among a configuration's policy options (by policy name, as
// internal/config keeps them); nil when they are not there.
func KnobsIn(opts map[string]registry.Options) *Knobs {
	k, _ := opts[Name].(*Knobs)
	return k
}
