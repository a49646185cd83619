package workers

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/sim"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/upstream"
)

// fakeWorker is an httptest server answering the health endpoint with a settable status and
// /v1/models with a settable list.
type fakeWorker struct {
	srv      *httptest.Server
	status   atomic.Int32
	mu       sync.Mutex
	models   []string
	authSeen string
	probes   atomic.Int32
}

// probed sets the status the worker answers its probes with and has c probe it n times.
func (f *fakeWorker) probed(ctx context.Context, c *Checker, status int32, n int) {
	f.status.Store(status)
	for range n {
		c.Check(ctx, f.srv.URL)
	}
}

func newFakeWorker(t *testing.T, endpoint string, models ...string) *fakeWorker {
	t.Helper()
	f := &fakeWorker{models: models}
	f.status.Store(http.StatusOK)
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+endpoint, func(w http.ResponseWriter, r *http.Request) {
		f.probes.Add(1)
		w.WriteHeader(int(f.status.Load()))
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.authSeen = r.Header.Get("Authorization")
		type model struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		}
		list := struct {
			Object string  `json:"object"`
			Data   []model `json:"data"`
		}{Object: "list", Data: []model{}}
		for _, m := range f.models {
			list.Data = append(list.Data, model{ID: m, Object: "model"})
		}
		_ = json.NewEncoder(w).Encode(list)
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeWorker) setModels(m ...string) {
	f.mu.Lock()
	f.models = m
	f.mu.Unlock()
}

// checkedAlone adds f's worker, alone, to a new pool and returns it with a checker of that pool
// (opts with newTestChecker's defaults): the setup of every test of how one worker's probes move
// its health.
func checkedAlone(t *testing.T, f *fakeWorker, opts HealthOptions) (*Worker, *Checker) {
	t.Helper()
	p := NewPool(Options{})
	added, err := p.Add(f.srv.URL)
	if err != nil || len(added) != 1 {
		t.Fatalf("Add(%s) = %v, %v; want one worker", f.srv.URL, added, err)
	}
	return added[0], newTestChecker(p, opts)
}

func newTestChecker(p *Pool, opts HealthOptions) *Checker {
	if opts.Endpoint == "" {
		opts.Endpoint = "/health"
	}
	if opts.Timeout == 0 {
		opts.Timeout = 5 * time.Second
	}
	if opts.FailureThreshold == 0 {
		opts.FailureThreshold = 3
	}
	if opts.SuccessThreshold == 0 {
		opts.SuccessThreshold = 2
	}
	opts.Interval = time.Hour
	return NewChecker(p, opts, &http.Client{}, slog.New(slog.DiscardHandler))
}

func TestCheckerFirstPassingProbeMarksHealthyAtOnce(t *testing.T) {
	f := newFakeWorker(t, "/health", "llama")
	p := NewPool(Options{DPSize: 2})
	_, _ = p.Add(f.srv.URL)
	c := newTestChecker(p, HealthOptions{SuccessThreshold: 5})
	c.Check(context.Background(), f.srv.URL)
	for _, w := range p.Get(f.srv.URL) {
		if !w.Healthy() {
			t.Errorf("%s unhealthy after a first passing probe", w.ID())
		}
		if got := w.Models(); !slices.Equal(got, []string{"llama"}) {
			t.Errorf("%s models = %v, want [llama]", w.ID(), got)
		}
	}
}

func TestCheckerFirstFailingProbeMarksUnhealthyAtOnce(t *testing.T) {
	f := newFakeWorker(t, "/health", "llama")
	f.status.Store(http.StatusServiceUnavailable)
	w, c := checkedAlone(t, f, HealthOptions{FailureThreshold: 5})
	w.SetHealthy(true) // even if something said otherwise before the first probe
	c.Check(context.Background(), f.srv.URL)
	if w.Healthy() {
		t.Error("healthy after a first failing probe")
	}
	if len(w.Models()) != 0 {
		t.Errorf("models read from a failing worker: %v", w.Models())
	}
}

func TestCheckerFailureThresholdMarksUnhealthy(t *testing.T) {
	f := newFakeWorker(t, "/health")
	w, c := checkedAlone(t, f, HealthOptions{FailureThreshold: 3, SuccessThreshold: 2})
	ctx := context.Background()
	c.Check(ctx, f.srv.URL)
	if !w.Healthy() {
		t.Fatal("first probe passed but the worker is unhealthy")
	}
	f.probed(ctx, c, http.StatusInternalServerError, 2)
	if !w.Healthy() {
		t.Fatal("2 failures of threshold 3 marked the worker unhealthy")
	}
	// A pass in between resets the failure count.
	f.probed(ctx, c, http.StatusOK, 1)
	f.probed(ctx, c, http.StatusInternalServerError, 2)
	if !w.Healthy() {
		t.Fatal("failures were not reset by a passing probe")
	}
	c.Check(ctx, f.srv.URL)
	if w.Healthy() {
		t.Fatal("3 consecutive failures did not mark the worker unhealthy")
	}
}

func TestCheckerSuccessThresholdBringsWorkerBack(t *testing.T) {
	f := newFakeWorker(t, "/health")
	w, c := checkedAlone(t, f, HealthOptions{FailureThreshold: 1, SuccessThreshold: 3})
	ctx := context.Background()
	c.Check(ctx, f.srv.URL) // it has been up once: from now on the thresholds apply
	f.probed(ctx, c, http.StatusBadGateway, 1)
	if w.Healthy() {
		t.Fatal("healthy after a failing probe (threshold 1)")
	}
	f.probed(ctx, c, http.StatusNoContent, 2) // any 2xx passes
	if w.Healthy() {
		t.Fatal("2 passes of threshold 3 brought the worker back")
	}
	// A failure in between resets the success count.
	f.probed(ctx, c, http.StatusBadGateway, 1)
	f.probed(ctx, c, http.StatusOK, 2)
	if w.Healthy() {
		t.Fatal("successes were not reset by a failing probe")
	}
	c.Check(ctx, f.srv.URL)
	if !w.Healthy() {
		t.Fatal("3 consecutive passes did not bring the worker back")
	}
}

func TestCheckerUnreachableWorkerIsUnhealthy(t *testing.T) {
	f := newFakeWorker(t, "/health")
	url := f.srv.URL
	f.srv.Close()
	p := NewPool(Options{})
	added, _ := p.Add(url)
	added[0].SetHealthy(true)
	c := newTestChecker(p, HealthOptions{})
	c.Check(context.Background(), url)
	if added[0].Healthy() {
		t.Error("a worker refusing connections is healthy")
	}
}

func TestCheckerProbesConfiguredEndpoint(t *testing.T) {
	f := newFakeWorker(t, "/ready")
	p := NewPool(Options{})
	added, _ := p.Add(f.srv.URL)
	c := newTestChecker(p, HealthOptions{Endpoint: "/ready"})
	c.Check(context.Background(), f.srv.URL)
	if !added[0].Healthy() || f.probes.Load() != 1 {
		t.Errorf("healthy=%v probes=%d; want the /ready endpoint probed once", added[0].Healthy(), f.probes.Load())
	}
	// The default /health is not served here: probing it would fail.
	c2 := newTestChecker(p, HealthOptions{Endpoint: "/health"})
	c2.Check(context.Background(), f.srv.URL)
	if added[0].Healthy() {
		t.Error("a 404 from the health endpoint counted as healthy")
	}
}

func TestCheckerRefreshesModels(t *testing.T) {
	f := newFakeWorker(t, "/health", "llama")
	p := NewPool(Options{DPSize: 2})
	_, _ = p.Add(f.srv.URL)
	c := newTestChecker(p, HealthOptions{})
	c.client = upstream.Dialer{APIKey: "sekret"}.Client()
	ctx := context.Background()
	c.Check(ctx, f.srv.URL)
	f.setModels("llama", "llama-lora")
	c.Check(ctx, f.srv.URL)
	for _, w := range p.Get(f.srv.URL) {
		if got := w.Models(); !slices.Equal(got, []string{"llama", "llama-lora"}) {
			t.Errorf("%s models = %v after refresh", w.ID(), got)
		}
	}
	if got := p.Models(); !slices.Equal(got, []string{"llama", "llama-lora"}) {
		t.Errorf("pool models = %v", got)
	}
	f.mu.Lock()
	auth := f.authSeen
	f.mu.Unlock()
	if auth != "Bearer sekret" {
		t.Errorf("/v1/models got Authorization %q, want the API key", auth)
	}
	// A failing probe keeps the last known models.
	f.probed(ctx, c, http.StatusInternalServerError, 1)
	if got := p.Get(f.srv.URL)[0].Models(); !slices.Equal(got, []string{"llama", "llama-lora"}) {
		t.Errorf("a failed probe changed the models to %v", got)
	}
}

func TestCheckAllProbesEveryWorkerAndForgetsRemoved(t *testing.T) {
	good := newFakeWorker(t, "/health", "m")
	bad := newFakeWorker(t, "/health", "m")
	bad.status.Store(http.StatusServiceUnavailable)
	p := NewPool(Options{})
	g, _ := p.Add(good.srv.URL)
	b, _ := p.Add(bad.srv.URL)
	c := newTestChecker(p, HealthOptions{})
	c.CheckAll(context.Background())
	if !g[0].Healthy() || b[0].Healthy() {
		t.Fatalf("good healthy=%v, bad healthy=%v", g[0].Healthy(), b[0].Healthy())
	}
	_, _ = p.Remove(bad.srv.URL)
	c.CheckAll(context.Background())
	c.mu.Lock()
	_, kept := c.counts[bad.srv.URL]
	c.mu.Unlock()
	if kept {
		t.Error("probe counts of a removed worker are kept")
	}
	// Re-adding the URL starts over: its first probe decides again.
	bad.status.Store(http.StatusOK)
	b, _ = p.Add(bad.srv.URL)
	c.Check(context.Background(), bad.srv.URL)
	if !b[0].Healthy() {
		t.Error("a re-added worker's first passing probe did not mark it healthy")
	}
}

func TestCheckOfRemovedWorkerIsHarmless(t *testing.T) {
	f := newFakeWorker(t, "/health")
	p := NewPool(Options{})
	c := newTestChecker(p, HealthOptions{})
	c.Check(context.Background(), f.srv.URL) // never registered
	if len(p.All()) != 0 {
		t.Error("Check registered a worker")
	}
}

// A worker that has never passed a probe has no record of flapping to guard against: a worker
// that was still starting when it was registered is healthy at its first passing probe, whatever
// the success threshold.
func TestCheckerWorkerThatWasNotUpYetIsHealthyAtItsFirstPass(t *testing.T) {
	f := newFakeWorker(t, "/health", "m")
	f.status.Store(http.StatusServiceUnavailable) // still loading
	w, c := checkedAlone(t, f, HealthOptions{SuccessThreshold: 3})
	ctx := context.Background()
	c.Check(ctx, f.srv.URL)
	c.Check(ctx, f.srv.URL)
	if w.Healthy() {
		t.Fatal("healthy while its probes fail")
	}
	f.probed(ctx, c, http.StatusOK, 1)
	if !w.Healthy() {
		t.Fatal("a worker that was never up is not healthy at its first passing probe")
	}
}

// A worker that is not up yet when it is registered is probed again soon, and sooner than the
// health interval, until its first pass: a fleet that comes up just after the router is routable
// at once, not an interval or two later. The interval here is an hour, so only the start-up
// probes can bring the worker in.
func TestCheckerProbesAWorkerThatIsNotUpYetUntilItsFirstPass(t *testing.T) {
	f := newFakeWorker(t, "/health", "m")
	f.status.Store(http.StatusServiceUnavailable)
	w, c := checkedAlone(t, f, HealthOptions{SuccessThreshold: 2})
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); c.Run(ctx) }()
	defer func() { cancel(); <-ran }()

	c.Check(ctx, f.srv.URL) // what the router does when it registers a worker
	testkit.WaitFor(t, "a few start-up probes", func() bool { return f.probes.Load() >= 3 })
	if w.Healthy() {
		t.Fatal("healthy while its probes fail")
	}
	f.status.Store(http.StatusOK)
	testkit.WaitFor(t, "healthy after the worker came up", w.Healthy)
}

// TestCheckerReadsWhichModelsAreAdaptersOfWhichBase runs a simulated vLLM worker serving a base
// model and two LoRA adapters: the checker reads each adapter's parent from /v1/models, and an
// adapter unloaded since is no longer one at the next check.
func TestCheckerReadsWhichModelsAreAdaptersOfWhichBase(t *testing.T) {
	cfg := sim.DefaultConfig()
	cfg.LoRAModules = []sim.LoRAModule{{Name: "sql", Path: "/adapters/sql"}, {Name: "chat", Path: "/adapters/chat"}}
	sw, err := sim.NewWorker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sw.Close)
	srv := httptest.NewServer(sw)
	t.Cleanup(srv.Close)
	p := NewPool(Options{})
	_, _ = p.Add(srv.URL)
	c := newTestChecker(p, HealthOptions{})
	ctx := context.Background()
	c.Check(ctx, srv.URL)
	w := p.Get(srv.URL)[0]
	if got := w.Models(); !slices.Equal(got, []string{"sim-model", "sql", "chat"}) {
		t.Fatalf("models %v", got)
	}
	for _, a := range []string{"sql", "chat"} {
		if base, ok := w.Adapter(a); !ok || base != "sim-model" {
			t.Fatalf("Adapter(%q) = %q, %v; want sim-model, true", a, base, ok)
		}
	}
	if _, ok := w.Adapter("sim-model"); ok {
		t.Fatal("the base model reads as an adapter")
	}
	resp, err := http.Post(srv.URL+"/v1/unload_lora_adapter", "application/json", strings.NewReader(`{"lora_name":"sql"}`))
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("unload: %v %v", resp, err)
	}
	resp.Body.Close()
	c.Check(ctx, srv.URL)
	if _, ok := w.Adapter("sql"); ok || slices.Contains(w.Models(), "sql") {
		t.Fatalf("an unloaded adapter is still listed: %v", w.Models())
	}
	if base, ok := w.Adapter("chat"); !ok || base != "sim-model" {
		t.Fatalf("Adapter(chat) = %q, %v after the unload of another", base, ok)
	}
}
