package sim

import (
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

func TestWorker_TTFTGrowsWithUncachedTokens(t *testing.T) {
	cfg := testConfig() // TimeScale 0: nothing sleeps, simulated times are still charged
	w := newWorker(t, cfg)
	rs := collect(w)

	short := []msg{{"user", words("s", 200)}}
	long := []msg{{"user", words("l", 4000)}}
	chat(t, w, short, 4)
	chat(t, w, long, 4)
	chat(t, w, long, 4) // now mostly cached

	got := rs.list()
	if len(got) != 3 {
		t.Fatalf("%d results, want 3", len(got))
	}
	for i, r := range got {
		want := cfg.PrefillOverhead + time.Duration(r.PromptTokens-r.CachedTokens)*cfg.PrefillTimePerToken
		if r.PrefillTime != want || r.TTFT != r.QueueTime+r.PrefillTime {
			t.Fatalf("result %d: prefill %v ttft %v, want prefill %v (overhead + %d uncached tokens)",
				i, r.PrefillTime, r.TTFT, want, r.PromptTokens-r.CachedTokens)
		}
		if wantE2E := r.TTFT + time.Duration(r.CompletionTokens-1)*cfg.InterTokenLatency; r.E2E != wantE2E {
			t.Fatalf("result %d: e2e %v, want %v", i, r.E2E, wantE2E)
		}
	}
	shortR, longCold, longWarm := got[0], got[1], got[2]
	if longCold.TTFT <= shortR.TTFT {
		t.Fatalf("TTFT of %d uncached tokens (%v) not above that of %d (%v)",
			longCold.PromptTokens, longCold.TTFT, shortR.PromptTokens, shortR.TTFT)
	}
	if longWarm.CachedTokens == 0 || longWarm.TTFT >= longCold.TTFT {
		t.Fatalf("cached repeat: %d cached tokens, TTFT %v, cold TTFT %v", longWarm.CachedTokens, longWarm.TTFT, longCold.TTFT)
	}
	if s := w.Stats(); s.TTFT != shortR.TTFT+longCold.TTFT+longWarm.TTFT {
		t.Fatalf("Stats.TTFT = %v, want the sum of the results", s.TTFT)
	}
}

func TestWorker_QueuesPastMaxNumSeqs(t *testing.T) {
	cfg, clock := flatPrefillConfig()
	cfg.MaxNumSeqs = 2
	w := newWorker(t, cfg)
	rs := collect(w)

	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			chat(t, w, []msg{{"user", words(string(rune('a'+i)), 100)}}, 1)
		}()
	}
	testkit.WaitFor(t, "two running and one waiting", func() bool {
		s := w.Stats()
		return clock.Sleepers() == 2 && s.Running == 2 && s.Waiting == 1
	})
	clock.Advance(10 * time.Millisecond) // the two running requests finish their prefill and end
	testkit.WaitFor(t, "the queued request to start", func() bool { return clock.Sleepers() == 1 && w.Stats().Waiting == 0 })
	clock.Advance(10 * time.Millisecond)
	wg.Wait()

	got := rs.list()
	slices.SortFunc(got, func(a, b Result) int { return int(a.TTFT - b.TTFT) })
	queue := []time.Duration{got[0].QueueTime, got[1].QueueTime, got[2].QueueTime}
	ttft := []time.Duration{got[0].TTFT, got[1].TTFT, got[2].TTFT}
	ms := time.Millisecond
	if !slices.Equal(queue, []time.Duration{0, 0, 10 * ms}) || !slices.Equal(ttft, []time.Duration{10 * ms, 10 * ms, 20 * ms}) {
		t.Fatalf("queue times %v, TTFTs %v; want [0 0 10ms] and [10ms 10ms 20ms]", queue, ttft)
	}
	if !got[2].Queued || got[0].Queued || got[1].Queued {
		t.Fatal("Queued flags do not match the queue times")
	}
	if s := w.Stats(); s.Queued != 1 || s.QueueTime != 10*ms || s.Running != 0 || s.Waiting != 0 {
		t.Fatalf("stats: queued %d, queue time %v, running %d, waiting %d", s.Queued, s.QueueTime, s.Running, s.Waiting)
	}
}

func TestWorker_QueueIsFIFO(t *testing.T) {
	cfg, clock := clockedConfig()
	cfg.MaxNumSeqs = 1
	cfg.PrefillTimePerToken = 0
	// Each request names its own model so the results tell them apart.
	models := []string{"m0", "m1", "m2", "m3"}
	cfg.Models = models
	w := newWorker(t, cfg)

	var mu sync.Mutex
	var order []string
	w.OnResult(func(r Result) {
		mu.Lock()
		order = append(order, r.Model)
		mu.Unlock()
	})
	var wg sync.WaitGroup
	for i, m := range models {
		wg.Add(1)
		go func() {
			defer wg.Done()
			do(t, w, "POST", "/v1/chat/completions", `{"model":"`+m+`","messages":[{"role":"user","content":"x"}],"max_tokens":1}`)
		}()
		// Each request must be in place before the next arrives.
		testkit.WaitFor(t, "request to arrive", func() bool { s := w.Stats(); return s.Running+s.Waiting == i+1 })
	}
	for i := range models {
		testkit.WaitFor(t, "a sleeper", func() bool { return clock.Sleepers() == 1 })
		clock.Advance(cfg.PrefillOverhead)
		testkit.WaitFor(t, "a result", func() bool { mu.Lock(); defer mu.Unlock(); return len(order) == i+1 })
	}
	wg.Wait()
	if !slices.Equal(order, models) {
		t.Fatalf("served in order %v, want arrival order %v", order, models)
	}
}

func TestWorker_TimeScaleMultipliesSleeps(t *testing.T) {
	cfg, clock := flatPrefillConfig()
	cfg.TimeScale = 0.5
	w := newWorker(t, cfg)
	rs := collect(w)
	done := make(chan struct{})
	go func() {
		defer close(done)
		chat(t, w, []msg{{"user", "hi"}}, 1)
	}()
	testkit.WaitFor(t, "prefill sleep", func() bool { return clock.Sleepers() == 1 })
	clock.Advance(4 * time.Millisecond)
	if clock.Sleepers() != 1 {
		t.Fatal("woke before 5ms of clock time (10ms × 0.5)")
	}
	clock.Advance(time.Millisecond)
	<-done
	if r := rs.list()[0]; r.TTFT != 10*time.Millisecond {
		t.Fatalf("reported TTFT %v, want the simulated 10ms", r.TTFT)
	}
}
