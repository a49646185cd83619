package sim

import (
	"context"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// errStalled ends a request that FailStall held until its client left or the
// worker closed.
var errStalled = errors.New("sim: request stalled by fault injection")

// Result is what one generation request cost, in simulated time. A worker
// hands every Result to the function set with OnResult.
type Result struct {
	Model            string
	PromptTokens     int
	CachedTokens     int
	CompletionTokens int
	// FinishReason is "length", "stop", or empty when the request did not
	// finish (its client left, or it stalled).
	FinishReason string
	// Queued reports whether the request waited to be admitted: for a running slot, or for KV
	// blocks (scheduler.go).
	Queued bool
	// QueueTime is the time spent waiting to be admitted the first time.
	QueueTime time.Duration
	// Preemptions counts how often the request was preempted to free KV blocks for another
	// running request (and computed again when readmitted).
	Preemptions int
	// PrefillTime is PrefillOverhead + uncached prompt tokens × PrefillTimePerToken; on a decode
	// leg, PrefillOverhead + one token computed + TransferredTokens × KVTransferTimePerToken.
	PrefillTime time.Duration
	// TransferredTokens are the prompt tokens a decode leg pulled from its prefill worker.
	TransferredTokens int
	// TransferFailed says that a decode leg found its prefill worker's blocks gone and computed
	// the prompt itself.
	TransferFailed bool
	// TTFT is QueueTime + PrefillTime, and, when the request was preempted before its first
	// token, the time it waited again and recomputed.
	TTFT time.Duration
	// E2E is TTFT + the decode steps after the first token: (CompletionTokens-1) ×
	// InterTokenLatency, each step longer by the prompt tokens other requests computed in it
	// when MaxNumBatchedTokens is set; and what preemptions after the first token cost.
	E2E time.Duration
	// Err is nil for a finished request.
	Err error
}

// Stats is a snapshot of a worker's counters and state.
type Stats struct {
	// Requests counts generation requests that passed validation.
	Requests int64
	// Completed counts requests that produced their whole output.
	Completed int64
	// Canceled counts requests whose client left before the end.
	Canceled int64
	// Failed counts requests that fault injection failed.
	Failed int64
	// Rejected counts requests refused with a 4xx status.
	Rejected int64
	// Queued counts requests that waited to be admitted.
	Queued int64
	// Preemptions counts running requests preempted for want of KV blocks
	// (vllm:num_preemptions_total).
	Preemptions int64

	// PromptTokens is the sum of prompt_tokens over admitted requests; it is
	// also the prefix cache's query count (vllm:prefix_cache_queries_total).
	PromptTokens int64
	// CachedTokens is the sum of cached_tokens; it is the prefix cache's hit
	// count (vllm:prefix_cache_hits_total).
	CachedTokens int64
	// GenerationTokens is the number of output tokens produced.
	GenerationTokens int64

	// QueueTime and TTFT are sums over admitted requests, in simulated time.
	QueueTime, TTFT time.Duration

	// Running and Waiting are the requests admitted and awaiting admission now (preempted
	// ones wait again).
	Running, Waiting int
	// CachedBlocks is the number of KV blocks holding data, PinnedBlocks
	// those held by running requests, CapacityBlocks the total.
	CachedBlocks, PinnedBlocks, CapacityBlocks int
	// Evictions counts cached blocks evicted to make room.
	Evictions int64
	// TransferredTokens are the prompt tokens decode legs pulled from prefill workers, and
	// TransferFailures the decode legs that found their blocks gone and computed them (pd.go).
	TransferredTokens, TransferFailures int64
	// StoredResponses is the number of Responses API responses held for
	// previous_response_id, GET and input_items.
	StoredResponses int
}

// job is one prompt to generate for.
type job struct {
	model     string
	seq       *prompt.Sequence // the rendered prompt; generated tokens are appended
	chat      bool             // close the reply with prompt.AssistantEnd when caching it
	maxTokens int
	ignoreEOS bool
	fault     string // "" or the failure mode drawn for this request
	// script, when set, is the whole output, token by token, in place of
	// drawn words: a tool call, rendered as the template renders it. It is
	// never cut short; the request finishes with "stop".
	script []string
	// cached is set to the prompt's cache hit in tokens once the prompt is
	// admitted, before the first token is emitted.
	cached int
	// transfer is the job's part in a prefill/decode KV transfer (pd.go).
	transfer transfer
}

// engine state shared by every request of a worker, guarded by mu: the KV cache, the
// scheduler that allocates from it, and the counters.
type engine struct {
	mu    sync.Mutex
	cache *kvcache.Cache
	stats Stats
}

// seqPool recycles prompt buffers between requests.
var seqPool = sync.Pool{New: func() any { return new(prompt.Sequence) }}

// hashPool recycles block-hash slices between requests.
var hashPool = sync.Pool{New: func() any { s := make([]uint64, 0, 256); return &s }}

// generate runs one job through the scheduler, the prefix cache and the
// latency model, calling emit with every output token as it is produced
// (the first right after prefill). It returns what the request cost and,
// when it did not finish, why: its context ended, emit failed, or it stalled.
// generateText runs j to its end for a non-streamed answer and returns the text it generated.
func (w *Worker) generateText(ctx context.Context, j *job) (string, Result) {
	var text strings.Builder
	res := w.generate(ctx, j, func(tok string) error {
		text.WriteString(tok)
		return nil
	})
	return text.String(), res
}

func (w *Worker) generate(ctx context.Context, j *job, emit func(tok string) error) Result {
	cfg := &w.cfg
	res := Result{Model: j.model, PromptTokens: j.seq.Len()}

	hp := hashPool.Get().(*[]uint64)
	defer hashPool.Put(hp)
	lora := w.lora(j.model)
	root := kvcache.Root(lora.name)
	hashes := kvcache.BlockHashes((*hp)[:0], root, j.seq.Text, j.seq.Ends, cfg.BlockSize)
	*hp = hashes
	var gen *textGen
	n, finish := len(j.script), "stop"
	if j.script == nil {
		gen = newTextGen(cfg.Seed, kvcache.HashBytes(j.seq.Text), !j.chat)
		n, finish = gen.length(j.maxTokens, j.ignoreEOS, cfg.OutputLenDist, cfg.OutputLenMean)
	}

	w.count(func(s *Stats) { s.Requests++ })
	arrival := w.clock.Now()
	s := &sequence{ctx: ctx, hashes: hashes, maxHit: (res.PromptTokens - 1) / cfg.BlockSize, tokens: res.PromptTokens}
	if res.Queued = !w.enqueue(s); res.Queued {
		if err := w.awaitAdmission(s); err != nil {
			res.QueueTime = w.unscale(w.clock.Now().Sub(arrival))
			return w.finish(res, err, 0)
		}
	}
	ended := false
	defer func() {
		if !ended {
			w.end(s)
		}
	}()
	res.QueueTime = w.unscale(w.clock.Now().Sub(arrival))
	w.metrics.queueTime.Observe(res.QueueTime.Seconds())

	// Admission looked the prompt up and pinned its blocks: the hit is what it found computed.
	w.eng.mu.Lock()
	res.CachedTokens = s.hit * cfg.BlockSize
	j.cached = res.CachedTokens
	st := &w.eng.stats
	st.PromptTokens += int64(res.PromptTokens)
	st.CachedTokens += int64(res.CachedTokens)
	st.QueueTime += res.QueueTime
	if res.Queued {
		st.Queued++
	}
	w.eng.mu.Unlock()
	w.metrics.admitted(res.PromptTokens, res.CachedTokens)

	perToken, itl := cfg.PrefillTimePerToken, cfg.InterTokenLatency
	overhead := cfg.PrefillOverhead
	if j.fault == FailSlow {
		perToken, itl, overhead = perToken*slowFactor, itl*slowFactor, overhead*slowFactor
	}
	computed := res.PromptTokens - res.CachedTokens
	if j.transfer.role == decodeLeg {
		if pull(j.transfer) {
			res.TransferredTokens = computed - 1 // vLLM computes the last prompt token itself
		} else {
			res.TransferFailed = true
		}
		w.metrics.pulled(computed, res.TransferredTokens)
		w.count(func(s *Stats) {
			s.TransferredTokens += int64(res.TransferredTokens)
			if res.TransferFailed {
				s.TransferFailures++
			}
		})
		computed -= res.TransferredTokens
	}
	res.PrefillTime = overhead + time.Duration(computed)*perToken + time.Duration(res.TransferredTokens)*cfg.KVTransferTimePerToken
	// resume brings s back after a preemption: it waits for admission again and computes its
	// prompt and generated tokens again, then its next token is out. lost adds up that time.
	var lost time.Duration
	resume := func() error {
		d, err := w.resume(s, j.seq, lora, overhead, perToken)
		lost += d
		return err
	}
	w.prefilling.Add(int64(computed))
	prefilled, err := w.sleepFor(s, res.PrefillTime)
	w.prefilling.Add(-int64(computed))
	if err != nil && ctx.Err() != nil {
		return w.finish(res, ctx.Err(), 0)
	}
	if err != nil || !w.computed(s, j.seq, lora) {
		if err := resume(); err != nil {
			return w.finish(res, err, 0)
		}
	}
	res.TTFT = res.QueueTime + prefilled + lost
	lostBeforeFirst := lost
	w.count(func(st *Stats) { st.TTFT += res.TTFT })
	w.metrics.ttft.Observe(res.TTFT.Seconds())

	stallAt := -1
	if j.fault == FailStall {
		stallAt = n / 2
	}
	var decodeTime time.Duration
	for i := 0; i < n; i++ {
		if i == stallAt {
			select {
			case <-ctx.Done():
			case <-w.done:
			}
			return w.finish(res, errStalled, i)
		}
		if i > 0 {
			// The step that makes token i+1 stores the KV of the i tokens generated so far. A
			// preempted request gets its next token from the recomputation instead.
			preempted := !w.reserve(s, res.PromptTokens+i)
			if !preempted {
				stepped, err := w.sleepFor(s, itl+w.prefillInStep(perToken))
				decodeTime += stepped
				if err != nil {
					if ctx.Err() != nil {
						return w.finish(res, ctx.Err(), i)
					}
					preempted = true
				}
			}
			if preempted {
				if err := resume(); err != nil {
					return w.finish(res, err, i)
				}
			}
		}
		var tok string
		if gen != nil {
			tok = gen.next()
		} else {
			tok = j.script[i]
		}
		j.seq.AppendToken(tok)
		if err := emit(tok); err != nil {
			return w.finish(res, err, i+1)
		}
	}
	// The request is done: cache its prompt and its reply.
	if j.chat {
		j.seq.AppendText(prompt.AssistantEnd)
	}
	sp := hashPool.Get().(*[]uint64)
	defer hashPool.Put(sp)
	stream := kvcache.BlockHashes((*sp)[:0], root, j.seq.Text, j.seq.Ends, cfg.BlockSize)
	*sp = stream
	w.commit(s, j.seq, stream, lora)
	ended = true
	res.Preemptions = s.preemptions // s is out of the scheduler: nobody else writes it now

	if j.transfer.role == prefillLeg {
		j.transfer.heldBlocks = w.hold(j.transfer.holdID, stream[:min(len(stream), res.PromptTokens/cfg.BlockSize)])
	}

	res.FinishReason = finish
	res.E2E = res.TTFT + decodeTime + lost - lostBeforeFirst
	w.metrics.e2e.Observe(res.E2E.Seconds())
	w.metrics.success.WithLabelValues(finish).Inc()
	return w.finish(res, nil, n)
}

// computed marks the blocks of the prompt s computed once its prefill ended, and reports
// whether s still ran: a request preempted during its prefill computes it again when readmitted.
func (w *Worker) computed(s *sequence, seq *prompt.Sequence, lora adapter) bool {
	w.eng.mu.Lock()
	defer w.eng.mu.Unlock()
	if s.state != seqRunning {
		return false
	}
	w.eng.cache.Computed(&s.pin)
	w.publishChanges(seq, s.hashes, lora)
	return true
}

// resume brings preempted request s back: it waits for admission again, then computes every token
// it holds again (its prompt less what the cache still has, and what it generated), as vLLM
// recomputes a preempted request, until that runs to its end without another preemption. It
// returns the simulated time this took.
func (w *Worker) resume(s *sequence, seq *prompt.Sequence, lora adapter, overhead, perToken time.Duration) (time.Duration, error) {
	w.eng.mu.Lock()
	start := s.preemptedAt
	w.eng.mu.Unlock()
	var computing time.Duration
	lost := func() time.Duration {
		if w.cfg.TimeScale == 0 {
			return computing
		}
		return w.unscale(w.clock.Now().Sub(start))
	}
	for {
		if err := w.awaitAdmission(s); err != nil {
			return lost(), err
		}
		w.eng.mu.Lock()
		if s.state != seqRunning {
			w.eng.mu.Unlock()
			continue // preempted again before it looked
		}
		recompute := s.tokens - s.hit*w.cfg.BlockSize
		run := s.run
		w.eng.mu.Unlock()
		d := overhead + time.Duration(recompute)*perToken
		computing += d
		w.prefilling.Add(int64(recompute))
		err := w.sleep(run, d)
		w.prefilling.Add(-int64(recompute))
		if s.ctx.Err() != nil {
			return lost(), s.ctx.Err()
		}
		if err == nil && w.computed(s, seq, lora) {
			return lost(), nil
		}
	}
}

// finish records the end of a request, hands its Result to the observer and
// returns it.
func (w *Worker) finish(res Result, err error, generated int) Result {
	res.CompletionTokens = generated
	res.Err = err
	w.metrics.generationTokens.Add(float64(generated))
	w.count(func(s *Stats) {
		s.GenerationTokens += int64(generated)
		switch {
		case err == nil:
			s.Completed++
		case errors.Is(err, errStalled):
			s.Failed++
		default:
			s.Canceled++
		}
	})
	if fn := w.onResult.Load(); fn != nil {
		(*fn)(res)
	}
	return res
}

// prefillInStep is how much longer a decode step takes for the prompt tokens that other requests
// are computing in it: up to MaxNumBatchedTokens of them, at perToken each.
func (w *Worker) prefillInStep(perToken time.Duration) time.Duration {
	if w.cfg.MaxNumBatchedTokens == 0 {
		return 0
	}
	return time.Duration(min(w.prefilling.Load(), int64(w.cfg.MaxNumBatchedTokens))) * perToken
}

// count applies f to the worker's stats under the engine lock.
func (w *Worker) count(f func(*Stats)) {
	w.eng.mu.Lock()
	f(&w.eng.stats)
	w.eng.mu.Unlock()
}

// sleep waits for the simulated duration d scaled by TimeScale.
func (w *Worker) sleep(ctx context.Context, d time.Duration) error {
	if w.cfg.TimeScale == 0 || d <= 0 {
		return nil
	}
	return w.clock.Sleep(ctx, time.Duration(float64(d)*w.cfg.TimeScale))
}

// sleepFor sleeps d in s's current admission and returns the simulated time it slept: d, or
// when the admission or the request ended first, the part of d that had passed by then (by the
// preemption, when one ended it, however late the goroutine woke).
func (w *Worker) sleepFor(s *sequence, d time.Duration) (time.Duration, error) {
	start := w.clock.Now()
	err := w.sleep(s.run, d)
	if err == nil {
		return d, nil
	}
	end := w.clock.Now()
	w.eng.mu.Lock()
	if s.preemptedAt.After(start) {
		end = s.preemptedAt
	}
	w.eng.mu.Unlock()
	return min(d, w.unscale(end.Sub(start))), err
}

// unscale turns a duration measured on the clock into simulated time.
func (w *Worker) unscale(d time.Duration) time.Duration {
	if w.cfg.TimeScale == 0 || w.cfg.TimeScale == 1 {
		return d
	}
	return time.Duration(float64(d) / w.cfg.TimeScale)
}
