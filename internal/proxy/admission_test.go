package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// Admission control on the routed path: the queue in front of the concurrency limits, priority,
// rate limits, and the answers to what cannot be admitted.

// gateWorker holds every request until the test lets it go, and records how many it held at
// once and the order of the requests' "input" markers.
type gateWorker struct {
	*testkit.Server
	gate     chan struct{}
	inFlight atomic.Int64
	peak     atomic.Int64
	mu       sync.Mutex
	order    []string
}

func newGateWorker(t *testing.T) *gateWorker {
	g := &gateWorker{gate: make(chan struct{})}
	g.Server = testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n := g.inFlight.Add(1)
		defer g.inFlight.Add(-1)
		for p := g.peak.Load(); n > p && !g.peak.CompareAndSwap(p, n); p = g.peak.Load() {
		}
		g.mu.Lock()
		g.order = append(g.order, marker(string(body)))
		g.mu.Unlock()
		select {
		case <-g.gate:
		case <-r.Context().Done():
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"ok":true}`))
	})
	return g
}

// marker is the "input" of a body such as {"input":"x"}.
func marker(body string) string {
	_, rest, _ := strings.Cut(body, `"input":"`)
	m, _, _ := strings.Cut(rest, `"`)
	return m
}

func admittingProxy(t *testing.T, w *gateWorker, opts admission.Options, limiter admission.Limiter, priorityHeader bool) *testProxy {
	t.Helper()
	c, err := admission.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	po := testOptions()
	po.Admission = &Admission{Controller: c, Limiter: limiter, PriorityHeader: priorityHeader}
	if opts.MaxInFlight == 0 && opts.Ready == nil {
		po.Admission.Controller = nil
	}
	return newTestProxy(t, setup{urls: []string{w.URL}, opts: &po})
}

// defaultRateLimiter is an in-memory rate limiter that gives every caller, all of them the
// default tenant here, rate.
func defaultRateLimiter(t *testing.T, rate admission.Rate) admission.Limiter {
	t.Helper()
	limiter, err := admission.NewMemoryLimiter(map[string]admission.Rate{"default": rate}, time.Now)
	if err != nil {
		t.Fatal(err)
	}
	return limiter
}

func embed(input string) string { return fmt.Sprintf(`{"model":"m","input":%q}`, input) }

// background sends an embeddings request that will wait at the gate, and hands over its answer
// when it ends.
func background(tp *testProxy, body string, header ...string) <-chan answer {
	return tp.sendInBackground(http.MethodPost, "/v1/embeddings", body, header...)
}

func TestRequestsBeyondTheConcurrencyLimitWaitTheirTurn(t *testing.T) {
	w := newGateWorker(t)
	tp := admittingProxy(t, w, admission.Options{MaxInFlight: 1, QueueSize: 8}, nil, false)
	var dones []<-chan answer
	for i := range 4 {
		dones = append(dones, background(tp, embed(fmt.Sprint(i))))
	}
	testkit.WaitWithin(t, 5*time.Second, "one request at the worker and three queued", func() bool {
		return w.inFlight.Load() == 1 && tp.Server.opts.Admission.Controller.Queued() == 3
	})
	close(w.gate)
	for _, d := range dones {
		if status := (<-d).status; status != http.StatusOK {
			t.Fatalf("a queued request ended %d, want 200", status)
		}
	}
	if p := w.peak.Load(); p != 1 {
		t.Fatalf("the worker held %d requests at once, want the limit of 1", p)
	}
	if c := tp.Server.opts.Admission.Controller; c.InFlight() != 0 || c.Queued() != 0 {
		t.Fatalf("in flight %d, queued %d after every request ended; want 0 and 0", c.InFlight(), c.Queued())
	}
}

// A request that cannot be admitted while the only place is taken is answered in its route's
// shape, with Retry-After, and counted under its reason: 408 once it waited out the queue timeout,
// as from the vLLM router, and 429 at once when there is no queue to wait in.
func TestAnUnadmittedRequestIsAnsweredInItsRoutesShape(t *testing.T) {
	for _, tc := range []struct {
		name, reason  string
		opts          admission.Options
		status        int
		anthropicType string
	}{
		{"queue timeout is 408", "queue_timeout", admission.Options{MaxInFlight: 1, QueueSize: 4, QueueTimeout: 50 * time.Millisecond},
			http.StatusRequestTimeout, "invalid_request_error"},
		{"full queue is 429 at once", "queue_full", admission.Options{MaxInFlight: 1}, http.StatusTooManyRequests, "rate_limit_error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			w := newGateWorker(t)
			defer close(w.gate)
			tp := admittingProxy(t, w, tc.opts, nil, false)
			first := background(tp, embed("first"))
			testkit.WaitWithin(t, 5*time.Second, "the first request at the worker", func() bool { return w.inFlight.Load() == 1 })
			status, h, body := tp.post(t, "/v1/embeddings", embed("second"))
			if status != tc.status || errorCode(t, body) != tc.reason || h.Get(HeaderRetryAfter) == "" {
				t.Fatalf("%d %s (Retry-After %q), want %d %s with Retry-After", status, body, h.Get(HeaderRetryAfter), tc.status, tc.reason)
			}
			status, _, body = tp.post(t, "/v1/messages", `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}]}`)
			if status != tc.status || anthropicErrorType(t, body) != tc.anthropicType {
				t.Fatalf("messages: %d %s, want %d %s", status, body, tc.status, tc.anthropicType)
			}
			if n := tp.Metrics.AdmissionRejections.WithLabelValues(tc.reason); testutil.ToFloat64(n) != 2 {
				t.Fatalf("admission_rejections_total{%s} = %v, want 2", tc.reason, testutil.ToFloat64(n))
			}
			w.gate <- struct{}{}
			if s := (<-first).status; s != http.StatusOK {
				t.Fatalf("the admitted request ended %d", s)
			}
		})
	}
}

func TestHigherPriorityLeavesTheQueueFirst(t *testing.T) {
	w := newGateWorker(t)
	tp := admittingProxy(t, w, admission.Options{MaxInFlight: 1, QueueSize: 8, Priorities: []string{"interactive", "batch"}}, nil, true)
	first := background(tp, embed("first"), HeaderPriority, "batch")
	testkit.WaitWithin(t, 5*time.Second, "the first request at the worker", func() bool { return w.inFlight.Load() == 1 })
	batch := background(tp, embed("batch"), HeaderPriority, "batch")
	testkit.WaitWithin(t, 5*time.Second, "the batch request queued", func() bool { return tp.Server.opts.Admission.Controller.Queued() == 1 })
	interactive := background(tp, embed("interactive"), HeaderPriority, "interactive")
	testkit.WaitWithin(t, 5*time.Second, "both queued", func() bool { return tp.Server.opts.Admission.Controller.Queued() == 2 })
	close(w.gate)
	for _, d := range []<-chan answer{first, batch, interactive} {
		<-d
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if strings.Join(w.order, ",") != "first,interactive,batch" {
		t.Fatalf("the worker served %v, want the interactive request before the batch one queued earlier", w.order)
	}
	if status, _, body := tp.post(t, "/v1/embeddings", embed("x"), HeaderPriority, "urgent"); status != http.StatusBadRequest || errorCode(t, body) != "unknown_priority" {
		t.Fatalf("unknown priority: %d %s, want 400 unknown_priority", status, body)
	}
}

func TestQueuedRequestWhoseClientLeftGivesUpItsPlace(t *testing.T) {
	w := newGateWorker(t)
	defer close(w.gate)
	tp := admittingProxy(t, w, admission.Options{MaxInFlight: 1, QueueSize: 8}, nil, false)
	background(tp, embed("first"))
	testkit.WaitWithin(t, 5*time.Second, "the first request at the worker", func() bool { return w.inFlight.Load() == 1 })
	c := tp.dial(t)
	if _, err := c.Write([]byte(rawRequest("POST", "/v1/embeddings", embed("leaves")))); err != nil {
		t.Fatal(err)
	}
	ctrl := tp.Server.opts.Admission.Controller
	testkit.WaitWithin(t, 5*time.Second, "the second request queued", func() bool { return ctrl.Queued() == 1 })
	c.Close()
	testkit.WaitWithin(t, 5*time.Second, "the queue emptied after its client left", func() bool { return ctrl.Queued() == 0 })
	testkit.WaitWithin(t, 5*time.Second, "the client_gone rejection counted", func() bool {
		return testutil.ToFloat64(tp.Metrics.AdmissionRejections.WithLabelValues("client_gone")) == 1
	})
}

func TestTenantOverItsRequestRateGets429WithRateLimitHeaders(t *testing.T) {
	w := newGateWorker(t)
	close(w.gate)
	tp := admittingProxy(t, w, admission.Options{}, defaultRateLimiter(t, admission.Rate{RequestsPerMinute: 2}), false)
	for i := range 2 {
		status, h, _ := tp.post(t, "/v1/embeddings", embed("x"))
		if status != http.StatusOK || h.Get("x-ratelimit-limit-requests") != "2" || h.Get("x-ratelimit-remaining-requests") != fmt.Sprint(1-i) {
			t.Fatalf("request %d: %d, limit %q remaining %q", i, status, h.Get("x-ratelimit-limit-requests"), h.Get("x-ratelimit-remaining-requests"))
		}
	}
	status, h, body := tp.post(t, "/v1/embeddings", embed("x"))
	if status != http.StatusTooManyRequests || errorCode(t, body) != "rate_limit_exceeded" || h.Get(HeaderRetryAfter) == "" || h.Get("x-ratelimit-remaining-requests") != "0" {
		t.Fatalf("third request: %d %s, headers %v", status, body, h)
	}
	if w.Hits.Load() != 2 {
		t.Fatalf("the worker got %d requests, want the 2 allowed", w.Hits.Load())
	}
}

func TestRequestAskingMoreTokensThanATenantsMinuteIsRefusedWithoutRetryAfter(t *testing.T) {
	w := newGateWorker(t)
	close(w.gate)
	tp := admittingProxy(t, w, admission.Options{}, defaultRateLimiter(t, admission.Rate{TokensPerMinute: 1000}), false)
	status, h, body := tp.post(t, chatPath, `{"model":"m","max_tokens":5000,"messages":[{"role":"user","content":"hi"}]}`)
	if status != http.StatusTooManyRequests || h.Get(HeaderRetryAfter) != "" || errorCode(t, body) != "rate_limit_exceeded" {
		t.Fatalf("%d %s (Retry-After %q), want 429 with no Retry-After: the request alone exceeds the minute", status, body, h.Get(HeaderRetryAfter))
	}
	if status, h, _ := tp.post(t, chatPath, `{"model":"m","max_tokens":500,"messages":[{"role":"user","content":"hi"}]}`); status != http.StatusOK || h.Get("x-ratelimit-limit-tokens") != "1000" {
		t.Fatalf("a request within the minute: %d, limit header %q", status, h.Get("x-ratelimit-limit-tokens"))
	}
}

// A refusal counter whose series appears only at its first refusal gives rate() and alerts
// nothing to work on until then: the search budget's and the shutdown's reasons have their
// series, at 0, from the router's start, before any request.
func TestAdmissionRejectionsForSearchesAndShutdownHaveSeriesFromTheStart(t *testing.T) {
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "a").URL}})
	families, err := tp.Metrics.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "vllm_router_admission_rejections_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" {
					seen[l.GetValue()] = m.GetCounter().GetValue()
				}
			}
		}
	}
	for _, reason := range []string{rejectedBySearchBudget, rejectedByShutdown} {
		if n, ok := seen[reason]; !ok || n != 0 {
			t.Errorf("admission_rejections_total{reason=%q} at start: present %v, value %v; want present at 0", reason, ok, n)
		}
	}
}
