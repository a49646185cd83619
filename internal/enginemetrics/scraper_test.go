package enginemetrics

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// metricsServer serves a /metrics page on loopback, honouring name[] as prometheus_client does
// unless ignoreFilter, and remembers the last request.
type metricsServer struct {
	srv          *httptest.Server
	scrapes      atomic.Int64
	status       atomic.Int64 // 0: 200
	ignoreFilter bool

	mu      sync.Mutex
	page    []byte
	lastReq *http.Request
}

func newMetricsServer(t *testing.T, page []byte) *metricsServer {
	m := &metricsServer{page: page}
	m.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.scrapes.Add(1)
		m.mu.Lock()
		m.lastReq = r
		p := m.page
		m.mu.Unlock()
		if s := m.status.Load(); s != 0 {
			w.WriteHeader(int(s))
			return
		}
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		if names := r.URL.Query()["name[]"]; len(names) > 0 && !m.ignoreFilter {
			p = filtered(p)
		}
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		_, _ = w.Write(p)
	}))
	t.Cleanup(m.srv.Close)
	return m
}

func (m *metricsServer) setPage(p string) {
	m.mu.Lock()
	m.page = []byte(p)
	m.mu.Unlock()
}

func (m *metricsServer) last() *http.Request {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.lastReq
}

func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

func newScraper(pool *workers.Pool, opts Options) *Scraper {
	return New(pool, opts, quiet())
}

func enginePool(t *testing.T, dp int, urls ...string) *workers.Pool {
	t.Helper()
	p := workers.NewPool(workers.Options{DPSize: dp, LoadSignal: workers.SignalEngine, EngineMaxAge: time.Hour})
	for _, u := range urls {
		if _, err := p.Add(u); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func TestScrapeAsksOnlyForTheLoadFamilies(t *testing.T) {
	m := newMetricsServer(t, page(t, "vllm.txt"))
	pool := enginePool(t, 1, m.srv.URL)
	s := newScraper(pool, Options{Interval: time.Second, Dialer: upstream.Dialer{APIKey: "k1"}})
	if err := s.Scrape(t.Context(), m.srv.URL); err != nil {
		t.Fatal(err)
	}
	r := m.last()
	if got := r.URL.Query()["name[]"]; !slices.Equal(got, Names) {
		t.Errorf("name[] = %v, want %v", got, Names)
	}
	if got := r.Header.Get("Authorization"); got != "Bearer k1" {
		t.Errorf("Authorization = %q, want the worker API key", got)
	}
	if got := r.Header.Get("Accept"); got != "text/plain;version=0.0.4" {
		t.Errorf("Accept = %q, want the text format", got)
	}
	w := pool.All()[0]
	if got := w.Load(); got != 15 {
		t.Errorf("Load = %d, want running 12 + waiting 3", got)
	}
	if st, fresh, ok := w.Engine(); !ok || !fresh || st.KVCacheUsage != 0.5 {
		t.Errorf("Engine = %+v fresh %v ok %v", st, fresh, ok)
	}
}

func TestScrapeReadsTheWholePageOfAWorkerThatIgnoresTheFilter(t *testing.T) {
	m := newMetricsServer(t, page(t, "vllm.txt"))
	m.ignoreFilter = true
	pool := enginePool(t, 1, m.srv.URL)
	if err := newScraper(pool, Options{Interval: time.Second}).Scrape(t.Context(), m.srv.URL); err != nil {
		t.Fatal(err)
	}
	if got := pool.All()[0].Load(); got != 15 {
		t.Fatalf("Load = %d, want 15", got)
	}
}

func TestScrapeRecordsTheFiguresOnEveryRankOfTheURL(t *testing.T) {
	m := newMetricsServer(t, page(t, "sglang.txt")) // 11 running + 4 queued
	pool := enginePool(t, 2, m.srv.URL)
	newScraper(pool, Options{Interval: time.Second}).ScrapeAll(t.Context())
	ranks := pool.All()
	if ranks[0].Load() != 8 || ranks[1].Load() != 7 {
		t.Fatalf("rank loads %d, %d; want 8 and 7 (15 split over two ranks)", ranks[0].Load(), ranks[1].Load())
	}
}

func TestScrapeOfAWorkerWithoutLoadMetricsFallsBackToInFlight(t *testing.T) {
	m := newMetricsServer(t, page(t, "vllm.txt"))
	pool := enginePool(t, 1, m.srv.URL)
	s := newScraper(pool, Options{Interval: time.Second})
	w := pool.All()[0]
	_ = s.Scrape(t.Context(), m.srv.URL)
	m.setPage("# a worker without vLLM's gauges\nprocess_open_fds 9\n")
	lease := w.Reserve()
	defer lease.Release()
	if err := s.Scrape(t.Context(), m.srv.URL); err != nil {
		t.Fatal(err)
	}
	if got := w.Load(); got != 1 || w.ScrapeErrors() != 0 {
		t.Fatalf("Load %d, errors %d; want in flight 1 and no error", got, w.ScrapeErrors())
	}
}

func TestFailedScrapesAreCountedOnEveryRank(t *testing.T) {
	m := newMetricsServer(t, page(t, "vllm.txt"))
	dead := httptest.NewServer(http.NotFoundHandler())
	dead.Close() // nothing listens there any more
	pool := enginePool(t, 2, m.srv.URL, dead.URL)
	s := newScraper(pool, Options{Interval: time.Second})
	m.status.Store(http.StatusInternalServerError)
	s.ScrapeAll(t.Context())
	s.ScrapeAll(t.Context())
	for _, w := range pool.All() {
		if w.ScrapeErrors() != 2 {
			t.Errorf("%s: %d scrape errors, want 2", w.Name(), w.ScrapeErrors())
		}
		if _, ok := w.LastScrape(); ok {
			t.Errorf("%s: a successful scrape recorded", w.Name())
		}
	}
}

// A worker that never answers does not hold the others back: they keep being scraped while its
// scrapes time out (before the next is due) and are counted as errors.
func TestASlowWorkerDoesNotDelayTheOthers(t *testing.T) {
	fast := newMetricsServer(t, page(t, "vllm.txt"))
	release := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	defer slow.Close()
	defer close(release)
	pool := enginePool(t, 1, slow.URL, fast.srv.URL)
	s := newScraper(pool, Options{Interval: 20 * time.Millisecond})
	if s.opts.Timeout != 18*time.Millisecond {
		t.Fatalf("timeout %v, want nine tenths of the interval", s.opts.Timeout)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	testkit.WaitFor(t, "ten scrapes of the fast worker and two timeouts of the slow one", func() bool {
		return fast.scrapes.Load() >= 10 && pool.Get(slow.URL)[0].ScrapeErrors() >= 2
	})
	cancel()
	<-done
	if _, ok := pool.Get(fast.srv.URL)[0].LastScrape(); !ok {
		t.Fatal("fast worker never recorded")
	}
}

func TestRunScrapesWorkersAddedLater(t *testing.T) {
	first := newMetricsServer(t, page(t, "vllm.txt"))
	later := newMetricsServer(t, page(t, "sglang.txt"))
	pool := enginePool(t, 1, first.srv.URL)
	s := newScraper(pool, Options{Interval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { s.Run(ctx); close(done) }()
	testkit.WaitFor(t, "the first worker's scrape", func() bool { return first.scrapes.Load() > 0 })
	added, _ := pool.Add(later.srv.URL)
	testkit.WaitFor(t, "the added worker's scrape", func() bool { _, ok := added[0].LastScrape(); return ok })
	if got := added[0].Load(); got != 15 {
		t.Errorf("added worker's Load = %d, want 15", got)
	}
	cancel()
	<-done
}
