package bench

import (
	"maps"
	"slices"
	"time"
)

// Report is the result of one bench: the workload's description and one TargetReport per
// target, in the order they ran.
type Report struct {
	Workload    string         `json:"workload"`
	API         string         `json:"api"`              // how each turn was sent: chat, responses, responses-chain or messages
	Params      map[string]any `json:"params,omitempty"` // workload and fleet settings, as given
	Sessions    int            `json:"sessions"`
	Requests    int            `json:"requests"` // per target, when every turn succeeds
	Concurrency int            `json:"concurrency"`
	// TimeScale is the simulated workers' time scale; latencies and throughputs in the report
	// are converted to full scale (measured time ÷ time scale).
	TimeScale float64 `json:"time_scale"`
	// ReuseCeiling is the workload's own reuse: the hit rate of one infinite cache (see
	// Workload.ReuseCeiling); absent when the workload does not know its blocks.
	ReuseCeiling *float64       `json:"reuse_ceiling,omitempty"`
	Targets      []TargetReport `json:"targets"`
	// Fronts is what each front of a --fronts run added to the requests sent direct, and
	// PromptBytes the size of those requests' messages; both absent otherwise.
	Fronts      []FrontReport `json:"fronts,omitempty"`
	PromptBytes *PromptBytes  `json:"prompt_bytes,omitempty"`
}

// TargetReport is what one target did with the workload. Latencies are in milliseconds.
type TargetReport struct {
	Name   string   `json:"name"`
	URLs   []string `json:"urls"`
	Policy string   `json:"policy,omitempty"`
	// RouterArgs are the router flags the bench's own routers ran with (--router-arg), in order.
	RouterArgs []string `json:"router_args,omitempty"`
	// Replicas is the number of in-process routers the requests went to round-robin, and
	// SessionStore their session store: redis when they shared their session map through the
	// bench's redis-server, memory otherwise. Both are absent for external targets.
	Replicas     int    `json:"replicas,omitempty"`
	SessionStore string `json:"session_store,omitempty"`
	SessionMode  string `json:"session_id"`

	Requests int `json:"requests"` // answered successfully
	Errors   int `json:"errors"`
	Skipped  int `json:"skipped"` // turns not sent because an earlier turn of the session failed

	PromptTokens int64 `json:"prompt_tokens"`
	CachedTokens int64 `json:"cached_tokens"`
	OutputTokens int64 `json:"output_tokens"`
	// HitRate is Σ cached_tokens / Σ prompt_tokens over the successful responses.
	HitRate float64 `json:"hit_rate"`
	// PredictedHitRate is what the router expected: Σ (x-vllm-router-prefix-match × prompt_tokens)
	// / Σ prompt_tokens over the successful responses that carried the header; nil (n/a) when
	// none did.
	PredictedHitRate *float64 `json:"predicted_hit_rate"`
	// ResponseNotFound counts the requests that continued a stored response (previous_response_id,
	// --api responses-chain) and were answered 404: the worker they reached did not hold it. It
	// is one of Errors.
	ResponseNotFound int `json:"response_not_found"`
	// SameWorker is the share of later turns (a session's second request on) that reached the
	// worker of the session's previous turn, failed turns included, by the worker header; nil
	// when no later turn and its predecessor both named their worker.
	SameWorker *float64 `json:"same_worker_later_turns"`

	// TokenizeCallsPerRequest is the calls the in-process routers made to an engine's /tokenize
	// (to route on KV-cache events, on a request's path or in the background) per request sent,
	// and TokenizeCachedPerRequest the requests routed on tokens they had already (the prompt's,
	// or an earlier turn's); both nil unless the entry ran with --kv-events.
	TokenizeCallsPerRequest  *float64 `json:"tokenize_calls_per_request,omitempty"`
	TokenizeCachedPerRequest *float64 `json:"tokenize_cached_per_request,omitempty"`

	// WorkerHitRate is Δ prefix_cache_hits / Δ prefix_cache_queries scraped from the workers
	// before and after the run; nil when no worker metrics were scraped.
	WorkerHitRate *float64 `json:"worker_hit_rate"`

	TTFT Latency `json:"ttft_ms"`
	E2E  Latency `json:"e2e_ms"`
	// ITL is the inter-token latency: the gaps between consecutive content-bearing events of
	// every successful stream, pooled.
	ITL Latency `json:"itl_ms"`

	RequestsPerSec     float64 `json:"requests_per_sec"`
	OutputTokensPerSec float64 `json:"output_tokens_per_sec"`
	DurationSec        float64 `json:"duration_sec"` // full scale
	WallSec            float64 `json:"wall_sec"`     // as measured

	Decisions map[string]int `json:"decisions"` // x-vllm-router-decision histogram
	// PDPaths is the x-vllm-router-pd histogram, and PDSkipped the share of later turns that
	// skipped the transfer (local_cached, local_short) on the previous turn's worker, over the
	// later turns that named a path; nil without P/D.
	PDPaths     map[string]int     `json:"pd_paths,omitempty"`
	PDSkipped   *float64           `json:"pd_skipped_later_turns,omitempty"`
	WorkerShare map[string]float64 `json:"worker_share"` // fraction of requests per worker
	// Imbalance is nil (n/a) when the target's worker loads could not be sampled.
	Imbalance *Imbalance `json:"imbalance"`
	// ErrorSamples holds the first few distinct error messages.
	ErrorSamples []string `json:"error_samples,omitempty"`

	// Pressure is the achieved KV oversubscription; nil unless the workload knows its working
	// sets and the target its KV capacity.
	Pressure *Pressure `json:"pressure,omitempty"`
	// Preemptions is Δ vllm:num_preemptions_total over the workers scraped; nil when not scraped.
	Preemptions *float64 `json:"preemptions,omitempty"`
	// WorkerSessions is, per worker, the distinct sessions it served and the most in progress on
	// it at once.
	WorkerSessions map[string]WorkerSessions `json:"worker_sessions,omitempty"`
}

// Latency holds percentiles in milliseconds.
type Latency struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
}

// maxErrorSamples bounds TargetReport.ErrorSamples.
const maxErrorSamples = 5

// summarize turns a run's records into a TargetReport. scale is the time scale of the workers
// (1 for real ones); durations are divided by it.
func summarize(t *Target, res runResult, scale float64) TargetReport {
	if scale <= 0 {
		scale = 1
	}
	r := TargetReport{
		Name: t.Name, URLs: t.URLs, Policy: t.Policy, RouterArgs: t.RouterArgs, Replicas: t.Replicas, SessionStore: t.SessionStore, SessionMode: t.SessionMode,
		Skipped: res.skipped, Decisions: map[string]int{}, WorkerShare: map[string]float64{},
	}
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) / scale }
	var ttft, e2e, itl []float64
	workers := map[string]int{}
	seenErr := map[string]bool{}
	var predicted, predictedOf float64
	for i := range res.records {
		rec := &res.records[i]
		if rec.Decision != "" {
			r.Decisions[rec.Decision]++
		}
		if rec.PD != "" {
			if r.PDPaths == nil {
				r.PDPaths = map[string]int{}
			}
			r.PDPaths[rec.PD]++
		}
		if rec.Err != "" {
			r.Errors++
			if rec.responseNotFound() {
				r.ResponseNotFound++
			}
			if !seenErr[rec.Err] && len(r.ErrorSamples) < maxErrorSamples {
				seenErr[rec.Err] = true
				r.ErrorSamples = append(r.ErrorSamples, rec.Err)
			}
			continue
		}
		r.Requests++
		if rec.Worker != "" {
			workers[rec.Worker]++
		}
		r.PromptTokens += int64(rec.PromptTokens)
		r.CachedTokens += int64(rec.CachedTokens)
		r.OutputTokens += int64(rec.OutputTokens)
		if rec.HasPrefixMatch {
			predicted += rec.PrefixMatch * float64(rec.PromptTokens)
			predictedOf += float64(rec.PromptTokens)
		}
		ttft = append(ttft, ms(rec.TTFT))
		e2e = append(e2e, ms(rec.E2E))
		for _, g := range rec.Gaps {
			itl = append(itl, ms(g))
		}
	}
	r.HitRate = HitRate(r.CachedTokens, r.PromptTokens)
	if predictedOf > 0 {
		v := predicted / predictedOf
		r.PredictedHitRate = &v
	}
	slices.Sort(ttft)
	slices.Sort(e2e)
	r.TTFT = Latency{P50: percentileSorted(ttft, 50), P90: percentileSorted(ttft, 90), P99: percentileSorted(ttft, 99)}
	r.E2E = Latency{P50: percentileSorted(e2e, 50), P90: percentileSorted(e2e, 90), P99: percentileSorted(e2e, 99)}
	slices.Sort(itl)
	r.ITL = Latency{P50: percentileSorted(itl, 50), P90: percentileSorted(itl, 90), P99: percentileSorted(itl, 99)}
	r.WallSec = res.wall.Seconds()
	r.DurationSec = r.WallSec / scale
	if r.DurationSec > 0 {
		r.RequestsPerSec = float64(r.Requests) / r.DurationSec
		r.OutputTokensPerSec = float64(r.OutputTokens) / r.DurationSec
	}
	for _, w := range slices.Sorted(maps.Keys(workers)) {
		r.WorkerShare[w] = float64(workers[w]) / float64(r.Requests)
	}
	r.Imbalance = imbalance(res.samples, ImbalanceWindow)
	r.Pressure = measuredPressure(res.samples, t.KVCapacityTokens)
	r.WorkerSessions = workerSessions(res.records)
	r.SameWorker = sameWorker(res.records)
	r.PDSkipped = pdSkipped(res.records)
	return r
}

// sameWorker is the share of later turns whose worker is the worker of the session's previous
// turn, over the later turns where both are known; nil when there is none.
func sameWorker(recs []Record) *float64 {
	type key struct{ session, turn int }
	worker := make(map[key]string, len(recs))
	for i := range recs {
		if recs[i].Worker != "" {
			worker[key{recs[i].Session, recs[i].Turn}] = recs[i].Worker
		}
	}
	same, later := 0, 0
	for i := range recs {
		rec := &recs[i]
		prev, ok := worker[key{rec.Session, rec.Turn - 1}]
		if rec.Turn == 0 || rec.Worker == "" || !ok {
			continue
		}
		later++
		if rec.Worker == prev {
			same++
		}
	}
	if later == 0 {
		return nil
	}
	v := float64(same) / float64(later)
	return &v
}

// pdSkipped is the share of later turns that named a P/D path and skipped the transfer on the
// worker of the session's previous turn; nil when no later turn named a path.
func pdSkipped(recs []Record) *float64 {
	type key struct{ session, turn int }
	worker := make(map[key]string, len(recs))
	for i := range recs {
		worker[key{recs[i].Session, recs[i].Turn}] = recs[i].Worker
	}
	skipped, later := 0, 0
	for i := range recs {
		rec := &recs[i]
		if rec.Turn == 0 || rec.PD == "" {
			continue
		}
		later++
		if (rec.PD == "local_cached" || rec.PD == "local_short") && rec.Worker != "" && worker[key{rec.Session, rec.Turn - 1}] == rec.Worker {
			skipped++
		}
	}
	if later == 0 {
		return nil
	}
	v := float64(skipped) / float64(later)
	return &v
}

// HitRate is cached / prompt, or 0 without prompt tokens.
func HitRate(cached, prompt int64) float64 {
	if prompt <= 0 {
		return 0
	}
	return float64(cached) / float64(prompt)
}
