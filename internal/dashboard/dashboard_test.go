package dashboard

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"regexp"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/workers"
)

func newTest(t *testing.T) (*Dashboard, *metrics.Metrics, *time.Time) {
	t.Helper()
	pool := workers.NewPool(workers.Options{CBFailureThreshold: 5, CBTimeout: time.Second})
	if _, err := pool.Add("http://user:s3cret@127.0.0.1:9"); err != nil {
		t.Fatal(err)
	}
	m := metrics.New(pool)
	now := time.Unix(1_700_000_000, 0)
	d := New(Options{Pool: pool, Metrics: m, Policy: "cache_aware"})
	d.clock = func() time.Time { return now }
	return d, m, &now
}

func TestHistoryIsPerSecondAndBounded(t *testing.T) {
	d, m, now := newTest(t)
	for i := range Samples + 50 {
		m.Requests.WithLabelValues("/v1/chat/completions", "2xx").Add(3)
		if i%2 == 0 {
			m.Requests.WithLabelValues("/v1/chat/completions", "5xx").Inc()
		}
		m.CacheAwareDecisions.WithLabelValues("session_id_match").Add(2)
		*now = now.Add(time.Second)
		d.Sample()
	}
	data := d.Data(context.Background())
	if len(data.History) != Samples-1 {
		t.Fatalf("history holds %d seconds, want %d", len(data.History), Samples-1)
	}
	for _, s := range data.History {
		if s.Requests < 3 || s.Requests > 4 || s.Decisions["session_id_match"] != 2 {
			t.Fatalf("a second of history: %+v", s)
		}
	}
	if want := (Samples + 50) * 2; data.Decisions["session_id_match"] != want {
		t.Fatalf("decisions since start %v, want %d", data.Decisions, want)
	}
	if last := data.History[len(data.History)-1]; last.Time != now.Unix() {
		t.Fatalf("last second at %d, want %d", last.Time, now.Unix())
	}
}

func TestDataShowsNoCredentials(t *testing.T) {
	d, _, _ := newTest(t)
	d.Sample()
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/dashboard/data", nil))
	body := rec.Body.String()
	if rec.Code != http.StatusOK || regexp.MustCompile(`s3cret|user:`).MatchString(body) {
		t.Fatalf("status %d, body %s", rec.Code, body)
	}
	var data Data
	if err := json.Unmarshal(rec.Body.Bytes(), &data); err != nil || len(data.Workers) != 1 {
		t.Fatalf("body %s: %v", body, err)
	}
}

func TestPageLoadsNothingFromElsewhere(t *testing.T) {
	d, _, _ := newTest(t)
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/dashboard", nil))
	if ct := rec.Header().Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Fatalf("content type %q", ct)
	}
	if m := regexp.MustCompile(`(?i)(src|href)\s*=|@import|url\(`).FindString(rec.Body.String()); m != "" {
		t.Fatalf("the page refers to another resource: %q", m)
	}
}

// workerData returns the data's only worker.
func workerData(t *testing.T, data Data) Worker {
	t.Helper()
	if len(data.Workers) != 1 {
		t.Fatalf("%d workers, want 1", len(data.Workers))
	}
	return data.Workers[0]
}

func approx(t *testing.T, what string, got *float64, want float64) {
	t.Helper()
	if got == nil || *got < want-1e-9 || *got > want+1e-9 {
		t.Errorf("%s = %v, want %v", what, deref(got), want)
	}
}

func deref(p *float64) any {
	if p == nil {
		return "null"
	}
	return *p
}

func TestHitRatesSumEveryDecisionLabelOfTheWorker(t *testing.T) {
	d, m, now := newTest(t)
	name := d.opts.Pool.All()[0].Name()
	m.PromptTokens.WithLabelValues(name, "session_id_match").Add(600)
	m.CachedTokensPredicted.WithLabelValues(name, "session_id_match").Add(540)
	m.CachedTokensAchieved.WithLabelValues(name, "session_id_match").Add(480)
	m.PromptTokens.WithLabelValues(name, "new_session").Add(400)
	m.CachedTokensPredicted.WithLabelValues(name, "new_session").Add(0)
	m.CachedTokensAchieved.WithLabelValues(name, "new_session").Add(20)
	m.CacheCorrections.WithLabelValues(name).Add(2)
	// Another worker's counters (one removed from the pool) do not count for this one.
	m.PromptTokens.WithLabelValues("http://10.0.0.9:8000", "session_id_match").Add(1000)
	m.CachedTokensAchieved.WithLabelValues("http://10.0.0.9:8000", "session_id_match").Add(1000)
	d.Sample()

	w := workerData(t, d.Data(context.Background()))
	if w.Cache.PromptTokens != 1000 || w.Cache.PredictedTokens != 540 || w.Cache.AchievedTokens != 500 || w.Cache.Corrections != 2 {
		t.Fatalf("cache figures %+v", w.Cache)
	}
	approx(t, "predicted hit rate", w.Cache.Predicted, 0.54)
	approx(t, "achieved hit rate", w.Cache.Achieved, 0.5)
	if w.Cache.RecentPredicted != nil || w.Cache.RecentAchieved != nil {
		t.Errorf("recent rates from a single sample: %v %v", deref(w.Cache.RecentPredicted), deref(w.Cache.RecentAchieved))
	}

	// A minute later: the recent window holds only what was answered in between.
	*now = now.Add(time.Minute)
	m.PromptTokens.WithLabelValues(name, "session_id_match").Add(1000)
	m.CachedTokensPredicted.WithLabelValues(name, "session_id_match").Add(900)
	m.CachedTokensAchieved.WithLabelValues(name, "session_id_match").Add(300)
	m.CacheCorrections.WithLabelValues(name).Inc()
	d.Sample()
	data := d.Data(context.Background())
	w = workerData(t, data)
	if data.RecentSeconds != 60 {
		t.Errorf("recent window %d s, want 60", data.RecentSeconds)
	}
	approx(t, "predicted hit rate since start", w.Cache.Predicted, 1440.0/2000)
	approx(t, "achieved hit rate since start", w.Cache.Achieved, 800.0/2000)
	approx(t, "recent predicted hit rate", w.Cache.RecentPredicted, 0.9)
	approx(t, "recent achieved hit rate", w.Cache.RecentAchieved, 0.3)
	if w.Cache.Corrections != 3 {
		t.Errorf("corrections %d, want 3", w.Cache.Corrections)
	}

	// A minute without answers: the window holds no prompt tokens, so its rates are n/a, while
	// the rates since the start stay.
	for range Samples {
		*now = now.Add(time.Second)
		d.Sample()
	}
	w = workerData(t, d.Data(context.Background()))
	if w.Cache.RecentPredicted != nil || w.Cache.RecentAchieved != nil {
		t.Errorf("recent rates over a quiet window: %v %v", deref(w.Cache.RecentPredicted), deref(w.Cache.RecentAchieved))
	}
	approx(t, "achieved hit rate since start", w.Cache.Achieved, 800.0/2000)
}

func TestHitRatesAreNullWithoutAnswers(t *testing.T) {
	d, _, now := newTest(t)
	d.Sample()
	*now = now.Add(time.Second)
	d.Sample()
	rec := httptest.NewRecorder()
	d.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/dashboard/data", nil))
	var raw struct {
		Workers []struct {
			Cache map[string]any `json:"cache"`
		} `json:"workers"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &raw); err != nil || len(raw.Workers) != 1 {
		t.Fatalf("body %s: %v", rec.Body, err)
	}
	cache := raw.Workers[0].Cache
	for _, k := range []string{"predicted_hit_rate", "achieved_hit_rate", "recent_predicted_hit_rate", "recent_achieved_hit_rate"} {
		if v, present := cache[k]; !present || v != nil {
			t.Errorf("%s = %v (present %v), want null", k, v, present)
		}
	}
	if cache["corrections"] != 0.0 || cache["prompt_tokens"] != 0.0 {
		t.Errorf("cache %v", cache)
	}
}

func TestWorkerShowsTheLoadSignalAndTheEngineFigures(t *testing.T) {
	// A fresh-figures age far beyond the test's run, so that freshness never depends on timing.
	pool := workers.NewPool(workers.Options{CBFailureThreshold: 5, CBTimeout: time.Second,
		LoadSignal: workers.SignalEngine, EngineMaxAge: time.Hour})
	added, err := pool.Add("http://127.0.0.1:9")
	if err != nil {
		t.Fatal(err)
	}
	w := added[0]
	d := New(Options{Pool: pool, Metrics: metrics.New(pool), Policy: "cache_aware"})

	// Before any scrape: the signal is the router's in-flight count, no engine figures, the
	// scrape state without an age.
	lease := w.Reserve()
	defer lease.Release()
	got := workerData(t, d.Data(context.Background()))
	if got.InFlight != 1 || got.Load != 1 || got.Engine != nil || got.Scrape == nil || got.Scrape.AgeSeconds != nil || got.Scrape.Errors != 0 {
		t.Fatalf("before a scrape: %+v engine %+v scrape %+v", got, got.Engine, got.Scrape)
	}

	w.SetEngine(w.BeginScrape(), workers.EngineStats{Running: 3, Waiting: 4, KVCacheUsage: 0.25, HasKVCacheUsage: true}, true)
	w.ScrapeFailed()
	w.ScrapeFailed()
	w.Reserve() // sent after the scrape began: the engine signal adds it
	data := d.Data(context.Background())
	if data.LoadSignal != workers.SignalEngine {
		t.Errorf("load signal %q, want engine", data.LoadSignal)
	}
	got = workerData(t, data)
	if got.InFlight != 2 || got.Load != 3+4+1 || got.Load != w.Load() {
		t.Errorf("in flight %d, load %d (worker says %d), want 2 and 8", got.InFlight, got.Load, w.Load())
	}
	if e := got.Engine; e == nil || e.Running != 3 || e.Waiting != 4 || !e.Fresh {
		t.Fatalf("engine %+v", e)
	}
	approx(t, "KV cache usage", got.Engine.KVCacheUsage, 0.25)
	if s := got.Scrape; s.Errors != 2 || s.AgeSeconds == nil || *s.AgeSeconds < 0 {
		t.Errorf("scrape %+v, age %v", s, deref(s.AgeSeconds))
	}

	// A worker without a KV usage metric: no usage rather than 0%.
	w.SetEngine(w.BeginScrape(), workers.EngineStats{Running: 1}, true)
	if got := workerData(t, d.Data(context.Background())); got.Engine == nil || got.Engine.KVCacheUsage != nil {
		t.Errorf("engine without KV usage: %+v", got.Engine)
	}
}

func TestRequestsSignalShowsNoScrape(t *testing.T) {
	d, _, _ := newTest(t)
	data := d.Data(context.Background())
	if data.LoadSignal != workers.SignalRequests {
		t.Errorf("load signal %q, want requests", data.LoadSignal)
	}
	if w := workerData(t, data); w.Engine != nil || w.Scrape != nil {
		t.Errorf("a pool that scrapes nothing shows engine %+v, scrape %+v", w.Engine, w.Scrape)
	}
}
