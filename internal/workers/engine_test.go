package workers

import (
	"sync"
	"testing"
	"time"
)

func poolWith(t testing.TB, opts Options, url string) []*Worker {
	t.Helper()
	p := NewPool(opts)
	added, err := p.Add(url)
	if err != nil {
		t.Fatal(err)
	}
	return added
}

func TestRequestsLoadIsTheInFlightCount(t *testing.T) {
	w := poolWith(t, Options{}, "http://w")[0]
	a := NewPool(Options{}).Acquire(w)
	a.Prefill(100000)
	w.SetEngine(w.BeginScrape(), EngineStats{Running: 40}, true)
	if w.Load() != 1 || w.InFlight() != 1 {
		t.Fatalf("Load %d, InFlight %d; want 1 and 1 (prefill and engine figures are not this signal's)", w.Load(), w.InFlight())
	}
	a.Close(Succeeded)
	if w.Load() != 0 {
		t.Fatalf("Load after close %d, want 0", w.Load())
	}
}

func TestTokensLoadWeighsAPrefillUntilItsFirstByte(t *testing.T) {
	p := NewPool(Options{LoadSignal: SignalTokens, LoadUnitTokens: 1000})
	added, _ := p.Add("http://w")
	w := added[0]
	a := p.Acquire(w)
	a.Prefill(2500)
	if got := w.Load(); got != 1+2 {
		t.Fatalf("Load with 2500 tokens pending = %d, want 1 in flight + 2500/1000", got)
	}
	b := p.Acquire(w)
	b.Prefill(600)
	if got := w.Load(); got != 2+3 {
		t.Fatalf("Load with 3100 tokens pending = %d, want 2 in flight + 3100/1000", got)
	}
	a.Prefilled()
	if got, pending := w.Load(), w.PendingPrefillTokens(); got != 2 || pending != 600 {
		t.Fatalf("after the first byte: Load %d, pending %d; want 2 and 600", got, pending)
	}
	if w.InFlight() != 2 {
		t.Fatalf("InFlight %d, want 2: the first byte does not end the request", w.InFlight())
	}
	b.Close(Cancelled)
	a.Close(Succeeded)
	if w.Load() != 0 || w.PendingPrefillTokens() != 0 {
		t.Fatalf("after both closed: Load %d, pending %d", w.Load(), w.PendingPrefillTokens())
	}
}

func TestTokensLoadUnitDefaultsTo1024(t *testing.T) {
	p := NewPool(Options{LoadSignal: SignalTokens})
	added, _ := p.Add("http://w")
	a := p.Acquire(added[0])
	a.Prefill(2047)
	if got := added[0].Load(); got != 2 {
		t.Fatalf("Load = %d, want 1 + 2047/1024 = 2", got)
	}
	a.Close(Succeeded)
}

func TestPrefillAfterPrefilledOrCloseIsIgnored(t *testing.T) {
	p := NewPool(Options{LoadSignal: SignalTokens, LoadUnitTokens: 1})
	added, _ := p.Add("http://w")
	w := added[0]
	a := p.Acquire(w)
	a.Prefilled()
	a.Prefill(50)
	if w.PendingPrefillTokens() != 0 {
		t.Fatalf("pending %d after a Prefill that came after Prefilled", w.PendingPrefillTokens())
	}
	a.Close(Succeeded)
	a.Prefill(50)
	if w.PendingPrefillTokens() != 0 || w.Load() != 0 {
		t.Fatalf("pending %d, Load %d after a Prefill that came after Close", w.PendingPrefillTokens(), w.Load())
	}
}

// Prefilled and Close race from many goroutines, with Prefill among them: whatever the order, the
// worker's pending tokens come back to zero (run with -race).
func TestPrefilledAndCloseReleaseTheWeightOnce(t *testing.T) {
	p := NewPool(Options{LoadSignal: SignalTokens, LoadUnitTokens: 1})
	added, _ := p.Add("http://w")
	w := added[0]
	for range 200 {
		a := p.Acquire(w)
		a.Prefill(100)
		var wg sync.WaitGroup
		wg.Go(func() { a.Prefill(7) })
		for range 3 {
			wg.Go(a.Prefilled)
			wg.Go(func() { a.Close(Succeeded) })
		}
		wg.Wait()
	}
	if w.PendingPrefillTokens() != 0 || w.Load() != 0 || w.pendingTokens.Load() != 0 {
		t.Fatalf("pending %d (raw %d), Load %d; want all 0", w.PendingPrefillTokens(), w.pendingTokens.Load(), w.Load())
	}
}

func TestEngineLoadIsTheWorkersRunningAndWaiting(t *testing.T) {
	w := poolWith(t, Options{LoadSignal: SignalEngine, EngineMaxAge: time.Hour}, "http://w")[0]
	w.SetEngine(w.BeginScrape(), EngineStats{Running: 5, Waiting: 3}, true)
	if got := w.Load(); got != 8 {
		t.Fatalf("Load = %d, want running 5 + waiting 3", got)
	}
	if w.InFlight() != 0 {
		t.Fatalf("InFlight = %d, want 0: the engine figures are not this router's", w.InFlight())
	}
}

func TestEngineLoadCountsRequestsSentSinceTheScrape(t *testing.T) {
	p := NewPool(Options{LoadSignal: SignalEngine, EngineMaxAge: time.Hour})
	added, _ := p.Add("http://w")
	w := added[0]
	before := p.Acquire(w) // sent before the scrape began: the worker's figures include it
	mark := w.BeginScrape()
	during := p.Acquire(w) // sent while the scrape is under way: maybe not in its figures
	w.SetEngine(mark, EngineStats{Running: 4}, true)
	if got := w.Load(); got != 4+1 {
		t.Fatalf("Load = %d, want 4 scraped + 1 sent since the scrape began", got)
	}
	after := p.Acquire(w)
	if got := w.Load(); got != 4+2 {
		t.Fatalf("Load = %d, want 4 scraped + 2 sent since", got)
	}
	// Ending requests does not lower the figure until the next scrape says so.
	before.Close(Succeeded)
	during.Close(Succeeded)
	after.Close(Succeeded)
	if got := w.Load(); got != 6 {
		t.Fatalf("Load = %d after closes, want 6 until the next scrape", got)
	}
	w.SetEngine(w.BeginScrape(), EngineStats{Running: 1}, true)
	if got := w.Load(); got != 1 {
		t.Fatalf("Load = %d after a new scrape, want 1", got)
	}
}

func TestEngineLoadFallsBackToInFlightWhenStale(t *testing.T) {
	p := NewPool(Options{LoadSignal: SignalEngine, EngineMaxAge: time.Hour})
	added, _ := p.Add("http://w")
	w := added[0]
	a := p.Acquire(w)
	if got := w.Load(); got != 1 {
		t.Fatalf("never scraped: Load = %d, want in flight 1", got)
	}
	mark := w.BeginScrape()
	mark.at -= int64(2 * time.Hour) // a scrape that began two hours ago
	w.SetEngine(mark, EngineStats{Running: 30}, true)
	if got := w.Load(); got != 1 {
		t.Fatalf("stale scrape: Load = %d, want in flight 1", got)
	}
	if _, fresh, ok := w.Engine(); fresh || !ok {
		t.Fatalf("Engine: fresh %v ok %v; want stale but known", fresh, ok)
	}
	a.Close(Succeeded)
}

func TestEngineLoadFallsBackWhenTheWorkerHasNoLoadMetrics(t *testing.T) {
	p := NewPool(Options{LoadSignal: SignalEngine, EngineMaxAge: time.Hour})
	added, _ := p.Add("http://w")
	w := added[0]
	w.SetEngine(w.BeginScrape(), EngineStats{Running: 9}, true)
	a := p.Acquire(w)
	w.SetEngine(w.BeginScrape(), EngineStats{}, false)
	if got := w.Load(); got != 1 {
		t.Fatalf("Load = %d, want in flight 1 once the worker shows no load metrics", got)
	}
	if _, ok := w.LastScrape(); !ok {
		t.Fatal("a scrape that answered without load metrics still succeeded")
	}
	a.Close(Succeeded)
}

func TestFailedScrapesAreCountedAndKeepTheLastFigures(t *testing.T) {
	w := poolWith(t, Options{LoadSignal: SignalEngine, EngineMaxAge: time.Hour}, "http://w")[0]
	if _, ok := w.LastScrape(); ok {
		t.Fatal("LastScrape ok before any scrape")
	}
	w.SetEngine(w.BeginScrape(), EngineStats{Running: 2, KVCacheUsage: 0.5, HasKVCacheUsage: true}, true)
	w.ScrapeFailed()
	w.ScrapeFailed()
	if w.ScrapeErrors() != 2 {
		t.Fatalf("ScrapeErrors = %d, want 2", w.ScrapeErrors())
	}
	if got := w.Load(); got != 2 {
		t.Fatalf("Load = %d, want the last fresh figure 2", got)
	}
	st, fresh, ok := w.Engine()
	if !ok || !fresh || st.KVCacheUsage != 0.5 {
		t.Fatalf("Engine = %+v fresh %v ok %v", st, fresh, ok)
	}
}

func TestEngineLoadSplitsAURLsFiguresEvenlyOverItsRanks(t *testing.T) {
	ranks := poolWith(t, Options{DPSize: 3, LoadSignal: SignalEngine, EngineMaxAge: time.Hour}, "http://w")
	for _, w := range ranks {
		w.SetEngine(w.BeginScrape(), EngineStats{Running: 5, Waiting: 2}, true)
	}
	var sum int64
	got := []int64{}
	for _, w := range ranks {
		got = append(got, w.Load())
		sum += w.Load()
	}
	if sum != 7 || got[0] != 3 || got[1] != 2 || got[2] != 2 {
		t.Fatalf("rank loads %v, want [3 2 2] (7 split over 3 ranks)", got)
	}
}

func TestEngineMaxAgeIsFiveIntervalsAndAtLeastASecond(t *testing.T) {
	if got := EngineMaxAge(100 * time.Millisecond); got != time.Second {
		t.Errorf("EngineMaxAge(100ms) = %v, want 1s", got)
	}
	if got := EngineMaxAge(time.Second); got != 5*time.Second {
		t.Errorf("EngineMaxAge(1s) = %v, want 5s", got)
	}
}

func TestPoolReportsItsLoadSignal(t *testing.T) {
	for in, want := range map[string]string{"": SignalRequests, SignalRequests: SignalRequests, SignalTokens: SignalTokens, SignalEngine: SignalEngine} {
		if got := NewPool(Options{LoadSignal: in}).LoadSignal(); got != want {
			t.Errorf("LoadSignal(%q) = %q, want %q", in, got, want)
		}
	}
}

func BenchmarkLoad(b *testing.B) {
	for _, sig := range []string{SignalRequests, SignalTokens, SignalEngine} {
		b.Run(sig, func(b *testing.B) {
			w := poolWith(b, Options{LoadSignal: sig, EngineMaxAge: time.Hour}, "http://w")[0]
			w.SetEngine(w.BeginScrape(), EngineStats{Running: 3}, true)
			b.ReportAllocs()
			var sum int64
			for b.Loop() {
				sum += w.Load()
			}
			_ = sum
		})
	}
}

func TestTheKVCapacityIsTheEnginesSplitOverItsRanksUntilSetByHand(t *testing.T) {
	ranks := poolWith(t, Options{DPSize: 2}, "http://w")
	for _, w := range ranks {
		w.SetEngine(w.BeginScrape(), EngineStats{Running: 1, KVCapacityTokens: 20000}, true)
		if w.KVCapacity() != 10000 {
			t.Fatalf("rank capacity %d, want 10000 (20000 over 2 ranks)", w.KVCapacity())
		}
		w.SetEngine(w.BeginScrape(), EngineStats{Running: 1}, true) // a page that does not say
		if w.KVCapacity() != 10000 {
			t.Fatalf("capacity %d after a page without it, want 10000 kept", w.KVCapacity())
		}
		w.SetKVCapacity(4000)
		w.SetEngine(w.BeginScrape(), EngineStats{Running: 1, KVCapacityTokens: 20000}, true)
		if w.KVCapacity() != 4000 {
			t.Fatalf("capacity %d, want the 4000 set by hand", w.KVCapacity())
		}
	}
}
