package router

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/sim"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// metricValue reads one sample of the router's /metrics, by its exact series text
// (`name{worker="..."}`); ok is false when there is no such series.
func metricValue(t *testing.T, tr *testRouter, series string) (float64, bool) {
	t.Helper()
	for line := range strings.Lines(readAll(t, mustGet(t, tr.url+"/metrics"))) {
		if rest, ok := strings.CutPrefix(line, series+" "); ok {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return v, true
		}
	}
	return 0, false
}

// With --load-signal engine a router sees load it did not place: requests sent straight to a
// worker (by another router replica, say) show in the worker's own running and waiting figures,
// so new requests go to the other worker. Once the busy worker stops answering, its scrapes
// fail, are counted, and its load falls back to the router's own in-flight count.
func TestEngineSignalSeesLoadPlacedByAnotherReplica(t *testing.T) {
	simCfg := sim.DefaultConfig()
	simCfg.MaxNumSeqs = 4
	busyFleet := startSimFleetOf(t, 1, simCfg)
	idleFleet := startSimFleetOf(t, 1, simCfg)
	busy, idle := busyFleet.URLs()[0], idleFleet.URLs()[0]

	cfg := testConfig()
	cfg.Policy = "power_of_two"
	cfg.LoadSignal = "engine"
	// A scrape times out at nine tenths of the interval: at 250 ms one on loopback does not, even
	// on a loaded machine, so the no-errors check below is about errors, not about timing.
	cfg.WorkerMetricsInterval = 250 * time.Millisecond
	cfg.WorkerURLs = []string{busy, idle}
	tr := startRouter(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tr.Start(ctx)

	// Another replica's load: twelve long generations sent straight to the busy worker, four
	// running and eight waiting (ignore_eos, or the sim's natural reply lengths end them early).
	others, stopOthers := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopOthers()
	for range 12 {
		wg.Go(func() {
			body := `{"model":"sim-model","messages":[{"role":"user","content":"write a long story"}],"max_tokens":4000,"ignore_eos":true}`
			req, _ := http.NewRequestWithContext(others, http.MethodPost, busy+"/v1/chat/completions", strings.NewReader(body))
			req.Header.Set("Content-Type", "application/json")
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		})
	}
	busyWorker, idleWorker := tr.Pool().Get(busy)[0], tr.Pool().Get(idle)[0]
	testkit.WaitFor(t, "the router to see the busy worker's twelve requests", func() bool { return busyWorker.Load() >= 12 })
	if busyWorker.InFlight() != 0 {
		t.Fatalf("in flight on the busy worker %d, want 0: the router sent it nothing", busyWorker.InFlight())
	}

	for i := range 10 {
		body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"question %d"}],"max_tokens":1}`, i)
		resp := tr.post(t, "/v1/chat/completions", body)
		readAll(t, resp)
		if resp.StatusCode != 200 {
			t.Fatalf("request %d: status %d", i, resp.StatusCode)
		}
		if got := resp.Header.Get(proxy.HeaderWorker); got != tenant.Redact(idle) {
			t.Fatalf("request %d went to %s (load %d vs %d), want the idle worker %s", i, got, busyWorker.Load(), idleWorker.Load(), idle)
		}
	}

	busyName := `{worker="` + busyWorker.Name() + `"}`
	if v, ok := metricValue(t, tr, "vllm_router_worker_load_signal"+busyName); !ok || v < 12 {
		t.Errorf("load_signal of the busy worker = %v (present %v), want at least 12", v, ok)
	}
	if v, ok := metricValue(t, tr, "vllm_router_worker_load"+busyName); !ok || v != 0 {
		t.Errorf("worker_load (in flight) of the busy worker = %v (present %v), want 0", v, ok)
	}
	if v, ok := metricValue(t, tr, "vllm_router_worker_metrics_age_seconds"+busyName); !ok || v < 0 || v > 60 {
		t.Errorf("metrics_age_seconds = %v (present %v)", v, ok)
	}
	if _, ok := metricValue(t, tr, "vllm_router_worker_kv_cache_usage_ratio"+busyName); !ok {
		t.Error("no kv_cache_usage_ratio series for a vLLM-like worker")
	}
	if v, ok := metricValue(t, tr, "vllm_router_worker_metrics_scrape_errors_total"+busyName); !ok || v != 0 {
		t.Errorf("scrape_errors_total = %v (present %v), want 0", v, ok)
	}

	// The busy worker goes away: its scrapes fail and, once its figures are stale, its load is
	// the router's own count again.
	stopOthers()
	busyFleet.Close()
	testkit.WaitFor(t, "failed scrapes to be counted and the signal to fall back", func() bool {
		return busyWorker.ScrapeErrors() >= 2 && busyWorker.Load() == busyWorker.InFlight()
	})
	if v, ok := metricValue(t, tr, "vllm_router_worker_metrics_scrape_errors_total"+busyName); !ok || v < 2 {
		t.Errorf("scrape_errors_total = %v (present %v), want at least 2", v, ok)
	}
	if v, ok := metricValue(t, tr, "vllm_router_worker_load_signal"+busyName); !ok || v != 0 {
		t.Errorf("load_signal after the fallback = %v (present %v), want in flight 0", v, ok)
	}
}

// Without --load-signal engine nothing is scraped and no scrape series are exported.
func TestRequestsSignalScrapesNothing(t *testing.T) {
	w := newFakeWorker(t)
	var scraped sync.Map
	w.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		scraped.Store(r.URL.Path, true)
	})
	cfg := testConfig()
	cfg.LoadSignal = "requests"
	cfg.WorkerURLs = []string{w.URL()}
	tr := startRouter(t, cfg)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tr.Start(ctx)
	if tr.scraper != nil {
		t.Fatal("a scraper was built for --load-signal requests")
	}
	if _, ok := metricValue(t, tr, `vllm_router_worker_metrics_scrape_errors_total{worker="`+tenant.Redact(w.URL())+`"}`); ok {
		t.Error("scrape error series exported without --load-signal engine")
	}
	if _, ok := scraped.Load("/metrics"); ok {
		t.Error("the worker's /metrics was read")
	}
}
