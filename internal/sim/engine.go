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
	// Queued reports whether the request waited for a running slot.
	Queued bool
	// QueueTime is the time spent waiting for a running slot.
	QueueTime time.Duration
	// PrefillTime is PrefillOverhead + uncached prompt tokens × PrefillTimePerToken; on a decode
	// leg, PrefillOverhead + one token computed + TransferredTokens × KVTransferTimePerToken.
	PrefillTime time.Duration
	// TransferredTokens are the prompt tokens a decode leg pulled from its prefill worker.
	TransferredTokens int
	// TransferFailed says that a decode leg found its prefill worker's blocks gone and computed
	// the prompt itself.
	TransferFailed bool
	// TTFT is QueueTime + PrefillTime.
	TTFT time.Duration
	// E2E is TTFT + the decode steps after the first token: (CompletionTokens-1) ×
	// InterTokenLatency, each step longer by the prompt tokens other requests computed in it
	// when MaxNumBatchedTokens is set.
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
	// Queued counts requests that waited for a running slot.
	Queued int64

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

	// Running and Waiting are the requests holding and awaiting a slot now.
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

// engine state shared by every request of a worker, guarded by mu.
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
	var gen *textGen
	n, finish := len(j.script), "stop"
	if j.script == nil {
		gen = newTextGen(cfg.Seed, kvcache.HashBytes(j.seq.Text), !j.chat)
		n, finish = gen.length(j.maxTokens, j.ignoreEOS, cfg.OutputLenDist, cfg.OutputLenMean)
	}

	w.count(func(s *Stats) { s.Requests++ })
	arrival := w.clock.Now()
	queued, err := w.sched.acquire(ctx)
	res.Queued = queued
	if err != nil {
		res.QueueTime = w.unscale(w.clock.Now().Sub(arrival))
		return w.finish(res, err, 0)
	}
	defer w.sched.release()
	res.QueueTime = w.unscale(w.clock.Now().Sub(arrival))
	w.metrics.queueTime.Observe(res.QueueTime.Seconds())

	// Admission: look the prompt up and pin its blocks.
	maxHit := (res.PromptTokens - 1) / cfg.BlockSize
	w.eng.mu.Lock()
	hit, pin := w.eng.cache.Acquire(hashes, maxHit)
	w.publishChanges(j.seq, hashes, lora)
	res.CachedTokens = hit * cfg.BlockSize
	j.cached = res.CachedTokens
	s := &w.eng.stats
	s.PromptTokens += int64(res.PromptTokens)
	s.CachedTokens += int64(res.CachedTokens)
	s.QueueTime += res.QueueTime
	if queued {
		s.Queued++
	}
	w.eng.mu.Unlock()
	w.metrics.admitted(res.PromptTokens, res.CachedTokens)
	committed := false
	defer func() {
		if !committed {
			w.eng.mu.Lock()
			w.eng.cache.Release(&pin)
			w.eng.mu.Unlock()
		}
	}()

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
	res.TTFT = res.QueueTime + res.PrefillTime
	w.prefilling.Add(int64(computed))
	err = w.sleep(ctx, res.PrefillTime)
	w.prefilling.Add(-int64(computed))
	if err != nil {
		return w.finish(res, err, 0)
	}
	w.eng.mu.Lock()
	w.eng.cache.Computed(&pin)
	w.publishChanges(j.seq, hashes, lora)
	w.eng.stats.TTFT += res.TTFT
	w.eng.mu.Unlock()
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
			step := itl + w.prefillInStep(perToken)
			decodeTime += step
			if err := w.sleep(ctx, step); err != nil {
				return w.finish(res, err, i)
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
	hashes = kvcache.BlockHashes(hashes[:0], root, j.seq.Text, j.seq.Ends, cfg.BlockSize)
	*hp = hashes
	w.eng.mu.Lock()
	w.eng.cache.Commit(&pin, hashes)
	w.publishChanges(j.seq, hashes, lora)
	w.eng.mu.Unlock()
	committed = true

	if j.transfer.role == prefillLeg {
		j.transfer.heldBlocks = w.hold(j.transfer.holdID, hashes[:min(len(hashes), res.PromptTokens/cfg.BlockSize)])
	}

	res.FinishReason = finish
	res.E2E = res.TTFT + decodeTime
	w.metrics.e2e.Observe(res.E2E.Seconds())
	w.metrics.success.WithLabelValues(finish).Inc()
	return w.finish(res, nil, n)
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

// unscale turns a duration measured on the clock into simulated time.
func (w *Worker) unscale(d time.Duration) time.Duration {
	if w.cfg.TimeScale == 0 || w.cfg.TimeScale == 1 {
		return d
	}
	return time.Duration(float64(d) / w.cfg.TimeScale)
}
