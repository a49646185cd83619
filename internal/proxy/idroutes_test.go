package proxy

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// The searches for stored responses the router does not know: an id route's, and a turn's that
// continues one (previous_response_id). Bounded in concurrency, per client and by the caller's
// rate limits; what they find is remembered.

// searchFleet is a router with cache_aware over n responses workers, with opts when given.
func searchFleet(t *testing.T, n int, opts *Options) (*testProxy, []*responsesWorker) {
	ws, urls := responsesWorkers(t, n)
	return newTestProxy(t, setup{urls: urls, policy: cacheAwarePolicy(), opts: opts}), ws
}

func totalHits(ws []*responsesWorker) int64 {
	var n int64
	for _, w := range ws {
		n += w.Hits.Load()
	}
	return n
}

// heldLookups is a fleet whose workers hold every lookup until the test releases one, and record
// how many they held at once.
type heldLookups struct {
	release chan struct{}
	mu      sync.Mutex
	held    int
	most    int
	arrived atomic.Int64
}

func (h *heldLookups) serve(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	h.held++
	h.most = max(h.most, h.held)
	h.mu.Unlock()
	h.arrived.Add(1)
	select {
	case <-h.release:
	case <-r.Context().Done():
	}
	h.mu.Lock()
	h.held--
	h.mu.Unlock()
	http.Error(w, `{"error":{"message":"not found"}}`, http.StatusNotFound)
}

func TestIDRouteSearchAsksAtMostItsConcurrencyOfWorkersAtOnce(t *testing.T) {
	h := &heldLookups{release: make(chan struct{})}
	var urls []string
	for range 8 {
		urls = append(urls, testkit.NewServer(t, h.serve).URL)
	}
	opts := testOptions()
	opts.ResponseSearch.Concurrency = 3
	tp := newTestProxy(t, setup{urls: urls, policy: cacheAwarePolicy(), opts: &opts})
	done := tp.sendInBackground(http.MethodGet, "/v1/responses/resp_unknown", "")
	// Each time as many lookups as the search may run are held, one is answered.
	for released := int64(0); released < 8; released++ {
		want := min(3, 8-released)
		testkit.WaitWithin(t, 5*time.Second, fmt.Sprintf("%d lookups held", want), func() bool {
			h.mu.Lock()
			defer h.mu.Unlock()
			return int64(h.held) >= want
		})
		h.release <- struct{}{}
	}
	if status := (<-done).status; status != http.StatusNotFound {
		t.Fatalf("GET: %d, want 404 once every worker answered 404", status)
	}
	if h.most > 3 || h.arrived.Load() != 8 {
		t.Fatalf("%d lookups held at once (%d in all), want at most 3 at once and one per worker", h.most, h.arrived.Load())
	}
}

func TestIDRouteSearchStopsAtTheFirstWorkerThatHasIt(t *testing.T) {
	opts := testOptions()
	opts.ResponseSearch.Concurrency = 1
	tp, ws := searchFleet(t, 8, &opts)
	ws[2].store("resp_elsewhere")
	status, h, body := tp.do(t, http.MethodGet, "/v1/responses/resp_elsewhere")
	if status != http.StatusOK || h.Get(HeaderWorker) != ws[2].URL || h.Get(HeaderDecision) != labelResponseSearch {
		t.Fatalf("GET: %d %s on %s: %s", status, h.Get(HeaderDecision), h.Get(HeaderWorker), body)
	}
	for i, w := range ws {
		want := map[int]int64{0: 1, 1: 1, 2: 2}[i] // a lookup each up to the holder, then the request itself
		if got := w.Hits.Load(); got != want {
			t.Errorf("worker %d got %d calls, want %d", i, got, want)
		}
	}
}

func TestIDRouteSearchesPastTheClientsBudgetAreRefused429(t *testing.T) {
	opts := testOptions()
	opts.ResponseSearch.PerMinute = 2
	tp, ws := searchFleet(t, 3, &opts)
	for i := range 2 {
		if status, _, body := tp.do(t, http.MethodGet, fmt.Sprintf("/v1/responses/resp_scan_%d", i)); status != http.StatusNotFound {
			t.Fatalf("search %d: %d %s, want 404 within the budget", i, status, body)
		}
	}
	before := totalHits(ws)
	status, h, body := tp.do(t, http.MethodGet, "/v1/responses/resp_scan_2")
	if status != http.StatusTooManyRequests || errorCode(t, body) != "response_search_limit" || h.Get(HeaderRetryAfter) == "" {
		t.Fatalf("third search: %d %s (Retry-After %q), want 429 response_search_limit", status, body, h.Get(HeaderRetryAfter))
	}
	if totalHits(ws) != before {
		t.Fatal("a search past the budget asked a worker")
	}
	if n := testutil.ToFloat64(tp.Metrics.AdmissionRejections.WithLabelValues(rejectedBySearchBudget)); n != 1 {
		t.Fatalf("admission_rejections_total{reason=%s} = %v, want 1", rejectedBySearchBudget, n)
	}
	// The holder of a known id, and ids found missing moments ago, are not searches.
	if status, h, _ := tp.do(t, http.MethodGet, "/v1/responses/resp_scan_0"); status != http.StatusNotFound || h.Get(HeaderDecision) != labelResponseMiss {
		t.Fatalf("a remembered miss past the budget: %d %s, want 404 %s", status, h.Get(HeaderDecision), labelResponseMiss)
	}
}

func TestIDRouteSearchCountsEachWorkerCallAgainstTheRateLimit(t *testing.T) {
	opts := testOptions()
	opts.Admission = &Admission{Limiter: defaultRateLimiter(t, admission.Rate{RequestsPerMinute: 10})}
	tp, ws := searchFleet(t, 3, &opts)
	status, h, _ := tp.do(t, http.MethodGet, "/v1/responses/resp_a")
	if status != http.StatusNotFound || h.Get("x-ratelimit-remaining-requests") != "6" {
		t.Fatalf("GET: %d, %s requests left; want 404 with 6 left (the request and its 3 lookups taken)", status, h.Get("x-ratelimit-remaining-requests"))
	}
	tp.do(t, http.MethodGet, "/v1/responses/resp_b")
	before := totalHits(ws)
	// 2 left: the request takes one, its first lookup the other, and its second is over the limit.
	status, h, body := tp.do(t, http.MethodGet, "/v1/responses/resp_c")
	if status != http.StatusTooManyRequests || errorCode(t, body) != "rate_limit_exceeded" || h.Get(HeaderRetryAfter) == "" {
		t.Fatalf("GET past the rate limit: %d %s, want 429 rate_limit_exceeded", status, body)
	}
	if got := totalHits(ws) - before; got > 1 {
		t.Fatalf("the search over the limit made %d worker calls, want at most the one the limit allowed", got)
	}
}

func TestContinuationOfAnUnknownResponseFollowsTheWorkerThatHoldsIt(t *testing.T) {
	tp, ws := searchFleet(t, 3, nil)
	p := tp.Server.responses
	ws[2].store("resp_before_restart") // stored before this router knew of it
	body := `{"model":"m","input":"more","previous_response_id":"resp_before_restart"}`
	status, h, answer := tp.post(t, "/v1/responses", body)
	if status != http.StatusOK || h.Get(HeaderWorker) != ws[2].URL || h.Get(HeaderDecision) != labelResponseSearch {
		t.Fatalf("turn: %d %s on %s: %s; want the holder's answer, %s", status, h.Get(HeaderDecision), h.Get(HeaderWorker), answer, labelResponseSearch)
	}
	if tenant, ok := p.ResponseHolder(t.Context(), "resp_before_restart"); !ok || tenant != tp.worker(t, ws[2].URL).ID() {
		t.Fatalf("the holder found was not remembered: %q %v", tenant, ok)
	}
	before := totalHits(ws)
	if status, h, _ := tp.post(t, "/v1/responses", body); status != http.StatusOK || h.Get(HeaderWorker) != ws[2].URL || h.Get(HeaderDecision) == labelResponseSearch {
		t.Fatalf("the same turn again: %d %s on %s, want the holder without a search", status, h.Get(HeaderDecision), h.Get(HeaderWorker))
	}
	if got := totalHits(ws) - before; got != 1 {
		t.Fatalf("the turn after the search cost %d worker calls, want 1", got)
	}
	if n := testutil.ToFloat64(tp.Metrics.CacheAwareDecisions.WithLabelValues(labelResponseSearch)); n != 1 {
		t.Fatalf("cache_aware_decisions_total{decision=%s} = %v, want 1", labelResponseSearch, n)
	}
}

func TestContinuationOfAResponseNoWorkerHasIs404AndRemembered(t *testing.T) {
	tp, ws := searchFleet(t, 3, nil)
	body := `{"model":"m","input":"more","previous_response_id":"resp_lost"}`
	status, h, answer := tp.post(t, "/v1/responses", body)
	if status != http.StatusNotFound || errorCode(t, answer) != "response_not_found" || !strings.Contains(answer, "resp_lost") || h.Get(HeaderDecision) != labelResponseSearch {
		t.Fatalf("turn: %d %s %s, want 404 response_not_found after a search", status, h.Get(HeaderDecision), answer)
	}
	if got := totalHits(ws); got != 3 {
		t.Fatalf("the search made %d worker calls, want one lookup per worker and no turn", got)
	}
	status, h, answer = tp.post(t, "/v1/responses", body)
	if status != http.StatusNotFound || h.Get(HeaderDecision) != labelResponseMiss || errorCode(t, answer) != "response_not_found" {
		t.Fatalf("turn again: %d %s %s, want 404 %s", status, h.Get(HeaderDecision), answer, labelResponseMiss)
	}
	if got := totalHits(ws); got != 3 {
		t.Fatalf("the remembered miss cost %d more worker calls, want none", got-3)
	}
	if n := testutil.ToFloat64(tp.Metrics.CacheAwareDecisions.WithLabelValues(labelResponseMiss)); n != 1 {
		t.Fatalf("cache_aware_decisions_total{decision=%s} = %v, want 1", labelResponseMiss, n)
	}
}

func TestContinuationLabelsAreCountedFromTheStart(t *testing.T) {
	tp, _ := searchFleet(t, 1, nil)
	seen := map[string]bool{}
	ch := make(chan prometheus.Metric, 64)
	go func() { tp.Metrics.CacheAwareDecisions.Collect(ch); close(ch) }()
	for m := range ch {
		for _, l := range metricLabels(t, m) {
			seen[l] = true
		}
	}
	for _, label := range []string{labelResponseSearch, labelResponseMiss} {
		if !seen[label] {
			t.Errorf("cache_aware_decisions_total has no %s series before the first request", label)
		}
	}
}

// metricLabels is the label values of one collected series.
func metricLabels(t *testing.T, m prometheus.Metric) []string {
	t.Helper()
	var d dto.Metric
	if err := m.Write(&d); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range d.GetLabel() {
		out = append(out, l.GetValue())
	}
	return out
}

// Searches are bounded for all clients together too: past --response-search-total-per-second,
// each new unknown id (an id route's or a turn's previous_response_id) is answered 503 without a
// lookup, whichever client asks, so many clients cannot each cost the fleet their own budget's
// worth. An id found missing is still answered from memory.
func TestSearchesPastTheTotalBudgetAreRefused503WhicheverClientAsks(t *testing.T) {
	opts := testOptions()
	opts.ClientKeys = keySet(t, "sk-alice tenant=alice\nsk-bob tenant=bob\n")
	opts.ResponseSearch.PerMinute = 600
	opts.ResponseSearch.TotalPerSecond = 0.001 // one search, then none for 1000 s
	tp, ws := searchFleet(t, 8, &opts)
	alice, bob := []string{"Authorization", "Bearer sk-alice"}, []string{"Authorization", "Bearer sk-bob"}

	if status, _, body := tp.do(t, http.MethodGet, "/v1/responses/resp_a", alice...); status != http.StatusNotFound {
		t.Fatalf("first search: %d %s, want the workers' 404", status, body)
	}
	for _, try := range []func() (int, http.Header, string){
		func() (int, http.Header, string) { return tp.do(t, http.MethodGet, "/v1/responses/resp_b", bob...) },
		func() (int, http.Header, string) {
			return tp.do(t, http.MethodDelete, "/v1/responses/resp_c", alice...)
		},
		func() (int, http.Header, string) {
			return tp.post(t, "/v1/responses", `{"model":"m","input":"more","previous_response_id":"resp_d"}`, bob...)
		},
	} {
		status, h, body := try()
		if status != http.StatusServiceUnavailable || errorCode(t, body) != "response_search_busy" || h.Get(HeaderRetryAfter) == "" {
			t.Fatalf("a search past the total: %d %s (Retry-After %q), want 503 response_search_busy", status, body, h.Get(HeaderRetryAfter))
		}
	}
	if got := totalHits(ws); got != 8 {
		t.Errorf("the workers got %d calls, want the first search's 8 lookups only", got)
	}
	if n := testutil.ToFloat64(tp.Metrics.AdmissionRejections.WithLabelValues(rejectedByTotalSearchBudget)); n != 3 {
		t.Errorf("admission_rejections_total{reason=%s} = %v, want 3", rejectedByTotalSearchBudget, n)
	}
	if status, h, _ := tp.do(t, http.MethodGet, "/v1/responses/resp_a", bob...); status != http.StatusNotFound || h.Get(HeaderDecision) != labelResponseMiss {
		t.Errorf("the id found missing: %d %s, want 404 %s from memory", status, h.Get(HeaderDecision), labelResponseMiss)
	}
}
