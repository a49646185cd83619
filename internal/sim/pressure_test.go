package sim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// pressure_test.go: a worker whose KV cache is too small for what is asked of it behaves as
// vLLM's scheduler does (scheduler.go).

// pressureConfig is a worker of 10 blocks of 16 tokens on a manual clock: every prefill takes
// 10ms and every decode step 10ms, whatever the tokens, so the tests step time in 10ms.
func pressureConfig(clock *ManualClock) Config {
	cfg := DefaultConfig()
	cfg.Clock = clock
	cfg.BlockSize = 16
	cfg.KVCacheBlocks = 10
	cfg.MaxNumSeqs = 8
	cfg.PrefillOverhead = 10 * time.Millisecond
	cfg.PrefillTimePerToken = 0
	cfg.InterTokenLatency = 10 * time.Millisecond
	return cfg
}

// idsPrompt is a completion request for a prompt of n token ids from base on, asking exactly
// maxTokens output tokens.
func idsPrompt(base, n, maxTokens int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprint(base + i)
	}
	return fmt.Sprintf(`{"model":"sim-model","prompt":[%s],"max_tokens":%d,"ignore_eos":true}`, strings.Join(ids, ","), maxTokens)
}

// complete sends a completion request and checks it succeeded.
func complete(t *testing.T, w *Worker, body string) {
	t.Helper()
	if rec := do(t, w, http.MethodPost, "/v1/completions", body); rec.Code != http.StatusOK {
		t.Errorf("status %d: %s", rec.Code, rec.Body)
	}
}

// drive advances the clock by step, each time once every running request sleeps, until done is
// closed; at most limit steps.
func drive(t *testing.T, w *Worker, clock *ManualClock, done <-chan struct{}, step time.Duration, limit int) {
	t.Helper()
	for range limit {
		select {
		case <-done:
			return
		default:
		}
		idle := false
		testkit.WaitFor(t, "every running request to sleep", func() bool {
			select {
			case <-done:
				return true
			default:
			}
			s := w.Stats()
			idle = s.Running+s.Waiting == 0
			return clock.Sleepers() == s.Running
		})
		if idle { // nothing left to schedule: the requests are writing their answers
			testkit.WaitFor(t, "the requests to return", func() bool {
				select {
				case <-done:
					return true
				default:
					return false
				}
			})
			return
		}
		clock.Advance(step)
	}
	t.Fatalf("requests still running after %d steps", limit)
}

// goAll runs fns at once and returns a channel closed when all returned.
func goAll(fns ...func()) <-chan struct{} {
	var wg sync.WaitGroup
	for _, fn := range fns {
		wg.Go(fn)
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

func metricValue(t *testing.T, w *Worker, name string, typ dto.MetricType) float64 {
	t.Helper()
	return value(t, scrape(t, w), name, typ)
}

func TestWorker_ARequestWaitsWhileKVCannotHoldItsPrompt(t *testing.T) {
	clock := NewManualClock(time.Unix(1_700_000_000, 0))
	w := newWorker(t, pressureConfig(clock))
	rs := collect(w)

	doneA := goAll(func() { complete(t, w, idsPrompt(1000, 96, 2)) }) // 6 blocks
	testkit.WaitFor(t, "the first request to prefill", func() bool { return clock.Sleepers() == 1 })
	doneB := goAll(func() { complete(t, w, idsPrompt(5000, 80, 1)) }) // 5 blocks: 4 are left
	testkit.WaitFor(t, "the second request to arrive", func() bool { s := w.Stats(); return s.Running+s.Waiting == 2 })

	s := w.Stats()
	if s.Running != 1 || s.Waiting != 1 {
		t.Fatalf("running %d, waiting %d; want the second request waiting for KV blocks though a slot is free", s.Running, s.Waiting)
	}
	if got := metricValue(t, w, "vllm:num_requests_waiting", dto.MetricType_GAUGE); got != 1 {
		t.Fatalf("vllm:num_requests_waiting = %v, want 1", got)
	}
	if got := metricValue(t, w, "vllm:kv_cache_usage_perc", dto.MetricType_GAUGE); got != 0.6 {
		t.Fatalf("vllm:kv_cache_usage_perc = %v, want 0.6 (6 of 10 blocks held)", got)
	}

	drive(t, w, clock, goAll(func() { <-doneA; <-doneB }), 10*time.Millisecond, 20)
	got := rs.list()
	if len(got) != 2 {
		t.Fatalf("%d results, want 2", len(got))
	}
	b := got[1]
	// The first request prefills (10ms) and takes one decode step (10ms); the second is admitted
	// when it ends.
	if !b.Queued || b.QueueTime != 20*time.Millisecond || b.TTFT != 30*time.Millisecond {
		t.Fatalf("second request: queued %v, queue time %v, TTFT %v; want queued 20ms, TTFT 30ms", b.Queued, b.QueueTime, b.TTFT)
	}
	if w.Stats().Preemptions != 0 {
		t.Fatalf("%d preemptions, want none: a waiting request preempts nobody", w.Stats().Preemptions)
	}
}

func TestWorker_DecodeWithoutAFreeBlockPreemptsTheLastAdmittedWhichRecomputes(t *testing.T) {
	clock := NewManualClock(time.Unix(1_700_000_000, 0))
	w := newWorker(t, pressureConfig(clock))
	rs := collect(w)

	// A (4 blocks) then B (5 blocks) fit in 10 blocks together; their first decode steps need a
	// block each, and only one is free: B, admitted last, is preempted.
	doneA := goAll(func() { complete(t, w, idsPrompt(1000, 64, 40)) })
	testkit.WaitFor(t, "A to prefill", func() bool { return clock.Sleepers() == 1 })
	doneB := goAll(func() { complete(t, w, idsPrompt(5000, 80, 2)) })
	testkit.WaitFor(t, "B to prefill", func() bool { return clock.Sleepers() == 2 })
	clock.Advance(10 * time.Millisecond)
	testkit.WaitFor(t, "B to be preempted", func() bool { return w.Stats().Preemptions == 1 })
	testkit.WaitFor(t, "A to decode alone", func() bool { return clock.Sleepers() == 1 })
	if s := w.Stats(); s.Running != 1 || s.Waiting != 1 {
		t.Fatalf("after the preemption running %d, waiting %d; want B back in the queue", s.Running, s.Waiting)
	}
	if got := metricValue(t, w, "vllm:num_preemptions_total", dto.MetricType_COUNTER); got != 1 {
		t.Fatalf("vllm:num_preemptions_total = %v, want 1", got)
	}

	drive(t, w, clock, goAll(func() { <-doneA; <-doneB }), 10*time.Millisecond, 100)
	byTokens := map[int]Result{}
	for _, r := range rs.list() {
		byTokens[r.PromptTokens] = r
	}
	a, b := byTokens[64], byTokens[80]
	if a.Preemptions != 0 || b.Preemptions != 1 {
		t.Fatalf("preemptions: A %d, B %d; want 0 and 1", a.Preemptions, b.Preemptions)
	}
	if a.CompletionTokens != 40 || b.CompletionTokens != 2 || a.Err != nil || b.Err != nil {
		t.Fatalf("A made %d tokens (%v), B %d (%v); want 40 and 2", a.CompletionTokens, a.Err, b.CompletionTokens, b.Err)
	}
	// B's first token came at 10ms; it was preempted before its second, waited until A ended
	// (A: prefill and 39 steps, 400ms) and computed its tokens again (10ms), which gave its
	// second token.
	if b.TTFT != 10*time.Millisecond || b.E2E != 410*time.Millisecond {
		t.Fatalf("B: TTFT %v, E2E %v; want 10ms and 410ms (wait for A, then recompute)", b.TTFT, b.E2E)
	}
	if a.E2E != 400*time.Millisecond {
		t.Fatalf("A: E2E %v, want 400ms: the preemption of B cost A nothing", a.E2E)
	}
}

func TestWorker_APreemptedRequestFindsItsPromptBlocksStillCachedUnlessEvicted(t *testing.T) {
	clock := NewManualClock(time.Unix(1_700_000_000, 0))
	cfg := pressureConfig(clock)
	cfg.PrefillTimePerToken = time.Millisecond // recompute charges what the cache lost
	cfg.PrefillOverhead = 0
	w := newWorker(t, cfg)
	rs := collect(w)

	// A: 4 blocks, then 3 more while it decodes 40 tokens. B: 5 blocks, preempted at its first
	// decode step; A then evicts two of B's cached blocks (the last ones: a request's tail goes
	// before its head) for its own growth.
	doneA := goAll(func() { complete(t, w, idsPrompt(1000, 64, 40)) })
	testkit.WaitFor(t, "A to prefill", func() bool { return clock.Sleepers() == 1 })
	doneB := goAll(func() { complete(t, w, idsPrompt(5000, 80, 2)) })
	testkit.WaitFor(t, "B to prefill", func() bool { return clock.Sleepers() == 2 })
	drive(t, w, clock, goAll(func() { <-doneA; <-doneB }), time.Millisecond, 1000)
	var b Result
	for _, r := range rs.list() {
		if r.PromptTokens == 80 {
			b = r
		}
	}
	if b.Preemptions != 1 {
		t.Fatalf("B preempted %d times, want 1", b.Preemptions)
	}
	// Readmitted, B holds its prompt and one generated token (81 tokens) and finds 3 of its 5
	// prompt blocks: it computes 81-48 = 33 tokens again, at 1ms each.
	aEnd := 64*time.Millisecond + 39*10*time.Millisecond
	if want := aEnd + 33*time.Millisecond; b.TTFT != 80*time.Millisecond || b.E2E != want {
		t.Fatalf("B: TTFT %v, E2E %v; want 80ms and %v: it waits until A ends at %v, then computes 33 tokens", b.TTFT, b.E2E, want, aEnd)
	}
}

func TestWorker_APromptLongerThanTheWholeKVCacheGetsTheContextLengthError(t *testing.T) {
	w := newWorker(t, pressureConfig(NewManualClock(time.Unix(1_700_000_000, 0))))
	rec := do(t, w, http.MethodPost, "/v1/completions", idsPrompt(1, 161, 1))
	if rec.Code != http.StatusBadRequest {
		t.Fatalf("status %d, want 400: %s", rec.Code, rec.Body)
	}
	var body errorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(body.Message, "maximum context length is 160 tokens") || !strings.Contains(body.Message, "161 input tokens") {
		t.Fatalf("message %q, want vLLM's context-length error naming 160 tokens (10 blocks of 16)", body.Message)
	}
	var models struct {
		Data []struct {
			MaxModelLen int `json:"max_model_len"`
		} `json:"data"`
	}
	if err := json.Unmarshal(do(t, w, http.MethodGet, "/v1/models", "").Body.Bytes(), &models); err != nil || len(models.Data) == 0 {
		t.Fatalf("models: %v", err)
	}
	if models.Data[0].MaxModelLen != 160 {
		t.Fatalf("max_model_len %d, want 160: what the KV cache holds", models.Data[0].MaxModelLen)
	}
}

func TestWorker_UnderPressureTheLeastRecentlyUsedPromptIsEvicted(t *testing.T) {
	cfg := testConfig()
	cfg.BlockSize, cfg.KVCacheBlocks = 16, 10
	w := newWorker(t, cfg)
	rs := collect(w)
	p1, p2, p3 := idsPrompt(1000, 48, 1), idsPrompt(2000, 48, 1), idsPrompt(3000, 48, 1) // 3 blocks each
	for _, p := range []string{p1, p2, p3, p1} {
		complete(t, w, p)
	}
	complete(t, w, idsPrompt(4000, 64, 1)) // 4 blocks: one free, and p2's three, the oldest
	complete(t, w, p1)
	complete(t, w, p2)
	got := rs.list()
	if hit1, hit2 := got[5].CachedTokens, got[6].CachedTokens; hit1 != 32 || hit2 != 0 {
		t.Fatalf("after the fifth prompt p1 hits %d tokens, p2 %d; want p1 kept (2 full blocks below its last token) and p2 evicted", hit1, hit2)
	}
	if labels := scrape(t, w)["vllm:cache_config_info"].GetMetric()[0].GetLabel(); !hasLabel(labels, "num_gpu_blocks", "10") {
		t.Fatalf("cache_config_info labels %v, want num_gpu_blocks 10", labels)
	}
}

func hasLabel(labels []*dto.LabelPair, name, value string) bool {
	for _, l := range labels {
		if l.GetName() == name && l.GetValue() == value {
			return true
		}
	}
	return false
}
