// Package metrics defines every Prometheus collector of the router, in one place. All names carry
// the vllm_router_ prefix, counters end in _total, durations are in seconds, and every label takes
// a bounded set of values: route patterns, status classes, worker tenants, decision labels, model
// names; never a session id or a raw path.
package metrics

import (
	"net/http"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

const namespace = "vllm_router"

// Metrics holds the router's collectors, registered on a registry of its own so that several
// routers can live in one process (tests, the bench).
type Metrics struct {
	Registry *prometheus.Registry

	Requests        *prometheus.CounterVec   // route, status_class
	RequestDuration *prometheus.HistogramVec // route
	TimeToFirstByte *prometheus.HistogramVec // route
	Processed       *prometheus.CounterVec   // worker
	PolicyDecisions *prometheus.CounterVec   // policy, worker
	Retries         prometheus.Counter
	UpstreamErrors  *prometheus.CounterVec // kind

	CacheAwareDecisions *prometheus.CounterVec // decision
	PrefixMatchRatio    prometheus.Histogram
	Evictions           *prometheus.CounterVec // kind

	// Prompt tokens of the answers that reported usage, and how many of them the policy predicted
	// and the worker reported served from its prefix cache: the prediction checked against the
	// engine's own count.
	PromptTokens          *prometheus.CounterVec // worker, decision
	CachedTokensPredicted *prometheus.CounterVec // worker, decision
	CachedTokensAchieved  *prometheus.CounterVec // worker, decision
	CacheCorrections      *prometheus.CounterVec // worker
	// Time to first token of the streamed answers whose policy predicted one, summed: predicted
	// and achieved, the prediction checked as the cached tokens are.
	TTFTPredicted *prometheus.CounterVec // worker
	TTFTAchieved  *prometheus.CounterVec // worker
	// Requests that waited for KV room for their session (cache_aware's session admission).
	SessionAdmissionWaiting prometheus.Gauge
	SessionAdmissionWait    prometheus.Histogram
	SessionAdmissionWaits   *prometheus.CounterVec // outcome

	SessionStoreRequests *prometheus.CounterVec   // op, result
	SessionStoreLatency  *prometheus.HistogramVec // op
	SessionStoreErrors   *prometheus.CounterVec   // op

	TenantRequests      *prometheus.CounterVec // tenant
	AccessLogDropped    prometheus.Counter
	AdmissionQueue      *prometheus.GaugeVec     // priority
	AdmissionWait       *prometheus.HistogramVec // priority
	AdmissionRejections *prometheus.CounterVec   // reason
	PDRequests          *prometheus.CounterVec   // path

	// Calls to an engine's /tokenize for a request's prompt tokens (--kv-events-endpoint).
	TokenizeRequests *prometheus.CounterVec // result
	TokenizeDuration prometheus.Histogram

	policyState policyStateCollector
	kvEvents    kvEventsCollector
}

// StatusCut is the status_class of requests whose response was cut off after it started (the
// worker broke off, or the request timeout passed mid-stream): neither a success nor a status.
const StatusCut = "cut"

// storeLatencyBuckets span a loopback round trip to a store timeout.
var storeLatencyBuckets = []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}

// latencyBuckets span fast non-streaming answers to long generations.
var latencyBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800}

// New builds and registers every collector. pool feeds the per-worker gauges at scrape time, so a
// removed worker's series vanish with it.
func New(pool *workers.Pool) *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		Requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "requests_total",
			Help: "Requests answered by the router, by route and HTTP status class (cut: the response broke off after it started)."}, []string{"route", "status_class"}),
		RequestDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "request_duration_seconds",
			Help: "Time from receiving a request to the end of its response.", Buckets: latencyBuckets}, []string{"route"}),
		TimeToFirstByte: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "time_to_first_byte_seconds",
			Help: "Time from receiving a request to the first response byte sent to the client.", Buckets: latencyBuckets}, []string{"route"}),
		Processed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "processed_requests_total",
			Help: "Requests answered by each worker tenant (after retries)."}, []string{"worker"}),
		PolicyDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "policy_decisions_total",
			Help: "Selections made by the policy, by policy and chosen worker tenant."}, []string{"policy", "worker"}),
		Retries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "retries_total",
			Help: "Requests re-sent to another worker before any byte reached the client."}),
		UpstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "upstream_errors_total",
			Help: "Failed upstream attempts by kind: connect, reset, first_byte, timeout, status_5xx, after_send, mid_stream, bad_response, stalled."}, []string{"kind"}),
		CacheAwareDecisions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "cache_aware_decisions_total",
			Help: "cache_aware decisions by label; exactly one per routed request."}, []string{"decision"}),
		PrefixMatchRatio: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "cache_aware_prefix_match_ratio",
			Help:    "Fraction of the request's history key or routing text the chosen worker was predicted to hold.",
			Buckets: []float64{0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1}}),
		Evictions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "cache_aware_evictions_total",
			Help: "cache_aware state evicted, by kind: tree, session_ttl, session_capacity, worker_removed."}, []string{"kind"}),
		PromptTokens: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "prompt_tokens_total",
			Help: "Prompt tokens of the answers that reported their usage, by worker tenant and decision label."}, []string{"worker", "decision"}),
		CachedTokensPredicted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "cached_tokens_predicted_total",
			Help: "Prompt tokens the policy predicted the worker held in its prefix cache (predicted fraction times the reported prompt tokens), same answers."}, []string{"worker", "decision"}),
		CachedTokensAchieved: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "cached_tokens_achieved_total",
			Help: "Prompt tokens the worker reported served from its prefix cache (usage cached_tokens or cache_read_input_tokens), same answers."}, []string{"worker", "decision"}),
		CacheCorrections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "cache_aware_corrections_total",
			Help: "Answers whose worker reported far fewer cached tokens than predicted, so the policy stopped counting on what the worker evicted."}, []string{"worker"}),
		SessionStoreRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "session_store_requests_total",
			Help: "Calls to the shared session store by op (get, set, delete, ping) and result (hit, miss, ok, error, skipped)."}, []string{"op", "result"}),
		SessionStoreLatency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "session_store_latency_seconds",
			Help: "Duration of the calls made to the shared session store, failed ones included.", Buckets: storeLatencyBuckets}, []string{"op"}),
		SessionStoreErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "session_store_errors_total",
			Help: "Failed or timed-out calls to the shared session store, by op; the local session map answered them."}, []string{"op"}),
		TenantRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "tenant_requests_total",
			Help: "Routed requests with a valid client key, by the key's tenant (the tenants of the client keys file)."}, []string{"tenant"}),
		AccessLogDropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: namespace, Name: "access_log_dropped_total",
			Help: "Access log entries dropped because the log could not keep up with the traffic."}),
		AdmissionQueue: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: namespace, Name: "admission_queue_length",
			Help: "Requests waiting for admission, by priority level."}, []string{"priority"}),
		AdmissionWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: namespace, Name: "admission_wait_seconds",
			Help: "Time admitted requests waited in the admission queue (0 when they started at once).", Buckets: latencyBuckets}, []string{"priority"}),
		AdmissionRejections: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "admission_rejections_total",
			Help: "Requests refused by admission control, by reason: rate_limit, queue_full, queue_timeout, client_gone, response_search, response_search_total, shutdown."}, []string{"reason"}),
		PDRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "pd_requests_total",
			Help: "Requests of the routes that allow prefill/decode disaggregation, by the path they took: transfer, local_cached, local_short, prefill_failed, transfer_failed, no_prefill_worker."}, []string{"path"}),
		TokenizeRequests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "tokenize_requests_total",
			Help: "Prompt tokens asked for routing on KV-cache events, by result: ok, cached (the same prompt was tokenized before), error, timeout (past --tokenize-timeout: the prefix tree routes)."}, []string{"result"}),
		TokenizeDuration: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "tokenize_duration_seconds",
			Help: "Duration of the calls to an engine's /tokenize, failed ones included.", Buckets: storeLatencyBuckets}),
		TTFTPredicted: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "ttft_predicted_seconds_total",
			Help: "Time to first token the policy predicted, summed over the streamed answers it predicted one for."}, []string{"worker"}),
		TTFTAchieved: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "ttft_achieved_seconds_total",
			Help: "Time to first token those answers took, from the attempt's send to the answer's first byte."}, []string{"worker"}),
		SessionAdmissionWaiting: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: namespace, Name: "session_admission_waiting",
			Help: "Requests waiting for KV room for their session (cache_aware, --session-admission)."}),
		SessionAdmissionWait: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: namespace, Name: "session_admission_wait_seconds",
			Help: "Each wait of a request for KV room for its session, until it was offered room, its wait was over, or its client left.", Buckets: latencyBuckets}),
		SessionAdmissionWaits: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: namespace, Name: "session_admission_waits_total",
			Help: "Waits for KV room, by how they ended: offered (room may have appeared: chosen again), timeout (--session-admission-timeout-secs: placed anyway), queue_full (placed anyway), client_gone."}, []string{"outcome"}),
	}
	m.Registry.MustRegister(
		m.Requests, m.RequestDuration, m.TimeToFirstByte, m.Processed, m.PolicyDecisions, m.Retries,
		m.UpstreamErrors, m.CacheAwareDecisions, m.PrefixMatchRatio, m.Evictions,
		m.PromptTokens, m.CachedTokensPredicted, m.CachedTokensAchieved, m.CacheCorrections,
		m.SessionStoreRequests, m.SessionStoreLatency, m.SessionStoreErrors,
		m.TenantRequests, m.AccessLogDropped, m.AdmissionQueue, m.AdmissionWait, m.AdmissionRejections, m.PDRequests,
		m.TokenizeRequests, m.TokenizeDuration, m.TTFTPredicted, m.TTFTAchieved,
		m.SessionAdmissionWaiting, m.SessionAdmissionWait, m.SessionAdmissionWaits,
		poolCollector{pool}, &m.policyState, &m.kvEvents,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	// Counters with known label values start at 0, so that rate() and alerts have a series
	// before the first event.
	for _, kind := range upstream.Kinds {
		m.UpstreamErrors.WithLabelValues(kind)
	}
	for _, result := range TokenizeResults {
		m.TokenizeRequests.WithLabelValues(result)
	}
	for _, outcome := range SessionAdmissionOutcomes {
		m.SessionAdmissionWaits.WithLabelValues(outcome)
	}
	return m
}

// Results of a call for a request's prompt tokens (TokenizeRequests).
const (
	TokenizeOK      = "ok"
	TokenizeCached  = "cached"
	TokenizeError   = "error"
	TokenizeTimeout = "timeout"
	// TokenizePrefix is a request answered with the tokens of an earlier turn of its
	// conversation, its own asked in the background; TokenizePrefixMismatch is such a background
	// answer that did not begin with the earlier turn's tokens (the model's prompts are then
	// always asked in full).
	TokenizePrefix         = "prefix"
	TokenizePrefixMismatch = "prefix_mismatch"
)

// SessionAdmissionOutcomes are every outcome label of SessionAdmissionWaits.
var SessionAdmissionOutcomes = []string{"offered", "timeout", "queue_full", "client_gone"}

// TokenizeResults are every result label of TokenizeRequests.
var TokenizeResults = []string{TokenizeOK, TokenizeCached, TokenizeError, TokenizeTimeout, TokenizePrefix, TokenizePrefixMismatch}

// WorkerAdded creates the counters of a worker tenant that joined, given by its shown name, at 0
// (ForgetWorker deletes them when it leaves): its answers and decisions, its corrections, and its
// prompt and cached tokens under each of labels, the decision labels the policy gives (the
// policy's name for one without labels). policy is the routing policy's name.
func (m *Metrics) WorkerAdded(policy string, labels []string, name string) {
	m.Processed.WithLabelValues(name)
	m.PolicyDecisions.WithLabelValues(policy, name)
	m.CacheCorrections.WithLabelValues(name)
	m.TTFTPredicted.WithLabelValues(name)
	m.TTFTAchieved.WithLabelValues(name)
	for _, label := range labels {
		m.PromptTokens.WithLabelValues(name, label)
		m.CachedTokensPredicted.WithLabelValues(name, label)
		m.CachedTokensAchieved.WithLabelValues(name, label)
	}
}

// AdmissionReporter is the admission controller's reporter: queue lengths and waits. Refusals
// are counted by the proxy in AdmissionRejections, since it sees every one, rate limits included.
func (m *Metrics) AdmissionReporter() admission.Reporter { return admissionReporter{m} }

type admissionReporter struct{ m *Metrics }

func (a admissionReporter) QueueLength(priority string, n int) {
	a.m.AdmissionQueue.WithLabelValues(priority).Set(float64(n))
}

func (a admissionReporter) Waited(priority string, d time.Duration) {
	a.m.AdmissionWait.WithLabelValues(priority).Observe(d.Seconds())
}

func (admissionReporter) Rejected(string, admission.Reason) {}

// Handler serves the registry in the Prometheus text format.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{Registry: m.Registry})
}

// PolicyState is what a policy with affinity state reports at scrape time (cache_aware does).
type PolicyState interface {
	TreeBytes() int
	TreeChars() int
	// Sessions is the session count per model, or nil when the store cannot count.
	Sessions() map[string]int
}

// SetPolicyState names the policy whose state sizes are read at scrape time.
func (m *Metrics) SetPolicyState(source PolicyState) { m.policyState.source.Store(&source) }

// KVEvents is what the KV-cache event subscriptions report at scrape time (kvevents.Set).
type KVEvents interface {
	Status() []kvevents.Status
	Index() *kvevents.Index
	UnknownTopics() int64
	DroppedConnections() kvevents.DroppedConnections
}

// SetKVEvents names the subscriptions whose state is read at scrape time.
func (m *Metrics) SetKVEvents(source KVEvents) { m.kvEvents.source.Store(&source) }

// Evicted counts policy state dropped, by kind (the policy's reporter interface).
func (m *Metrics) Evicted(kind string, n int) { m.Evictions.WithLabelValues(kind).Add(float64(n)) }

// ObserveSessionStore counts one session store call; d is 0 when the store was not contacted.
func (m *Metrics) ObserveSessionStore(op, result string, d time.Duration) {
	m.SessionStoreRequests.WithLabelValues(op, result).Inc()
	if d > 0 {
		m.SessionStoreLatency.WithLabelValues(op).Observe(d.Seconds())
	}
}

// SessionStoreError counts one failed session store call.
func (m *Metrics) SessionStoreError(op string) { m.SessionStoreErrors.WithLabelValues(op).Inc() }

// ForgetWorker deletes the series of a removed worker tenant, given by its shown name.
func (m *Metrics) ForgetWorker(name string) {
	m.Processed.DeleteLabelValues(name)
	byWorker := prometheus.Labels{"worker": name}
	for _, vec := range []*prometheus.CounterVec{m.PolicyDecisions, m.PromptTokens, m.CachedTokensPredicted, m.CachedTokensAchieved, m.CacheCorrections,
		m.TTFTPredicted, m.TTFTAchieved} {
		vec.DeletePartialMatch(byWorker)
	}
}

// StatusClass maps an HTTP status to its class label ("2xx" … "5xx").
func StatusClass(code int) string {
	switch {
	case code >= 500:
		return "5xx"
	case code >= 400:
		return "4xx"
	case code >= 300:
		return "3xx"
	case code >= 200:
		return "2xx"
	}
	return "1xx"
}

var (
	workerLoadDesc = prometheus.NewDesc(namespace+"_worker_load",
		"Requests the router has in flight on each worker tenant (whatever --load-signal).", []string{"worker"}, nil)
	workerLoadSignalDesc = prometheus.NewDesc(namespace+"_worker_load_signal",
		"The load the policies balance on for each worker tenant, by --load-signal (requests, tokens or engine).", []string{"worker"}, nil)
	workerScrapeErrorsDesc = prometheus.NewDesc(namespace+"_worker_metrics_scrape_errors_total",
		"Failed scrapes of each worker tenant's /metrics (--load-signal engine).", []string{"worker"}, nil)
	workerMetricsAgeDesc = prometheus.NewDesc(namespace+"_worker_metrics_age_seconds",
		"Seconds since the last successful scrape of the worker tenant's /metrics began; no series before the first.", []string{"worker"}, nil)
	workerKVCacheUsageDesc = prometheus.NewDesc(namespace+"_worker_kv_cache_usage_ratio",
		"KV cache usage of the worker (0..1) at its last scrape that reported it (vllm:kv_cache_usage_perc, sglang:token_usage).", []string{"worker"}, nil)
	workerHealthyDesc = prometheus.NewDesc(namespace+"_worker_healthy",
		"1 when the worker tenant passes health checks, else 0.", []string{"worker"}, nil)
	workerRoleDesc = prometheus.NewDesc(namespace+"_worker_role",
		"1 for each worker tenant, labelled with its role under prefill/decode disaggregation (colocated, prefill or decode).", []string{"worker", "role"}, nil)
	activeWorkersDesc = prometheus.NewDesc(namespace+"_active_workers",
		"Worker tenants that are healthy and whose circuit breaker is not open.", nil, nil)
)

var (
	treeBytesDesc = prometheus.NewDesc(namespace+"_cache_aware_tree_bytes",
		"Heap bytes charged to the cache_aware prefix tree (all models; bounded by --max-tree-size).", nil, nil)
	treeCharsDesc = prometheus.NewDesc(namespace+"_cache_aware_tree_chars",
		"Bytes of history text held in the cache_aware prefix tree (all models).", nil, nil)
	sessionsDesc = prometheus.NewDesc(namespace+"_cache_aware_sessions",
		"Entries in the cache_aware session map of each served model (in-process store only).", []string{"model"}, nil)
)

// policyStateCollector reads the policy's state sizes at scrape time, so the gauges are never stale.
type policyStateCollector struct {
	source atomic.Pointer[PolicyState]
}

func (c *policyStateCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- treeBytesDesc
	ch <- treeCharsDesc
	ch <- sessionsDesc
}

func (c *policyStateCollector) Collect(ch chan<- prometheus.Metric) {
	source := c.source.Load()
	if source == nil {
		return
	}
	s := *source
	ch <- prometheus.MustNewConstMetric(treeBytesDesc, prometheus.GaugeValue, float64(s.TreeBytes()))
	ch <- prometheus.MustNewConstMetric(treeCharsDesc, prometheus.GaugeValue, float64(s.TreeChars()))
	for model, n := range s.Sessions() {
		ch <- prometheus.MustNewConstMetric(sessionsDesc, prometheus.GaugeValue, float64(n), model)
	}
}

// poolCollector reads the pool at scrape time.
type poolCollector struct{ pool *workers.Pool }

func (c poolCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- workerLoadDesc
	ch <- workerLoadSignalDesc
	ch <- workerScrapeErrorsDesc
	ch <- workerMetricsAgeDesc
	ch <- workerKVCacheUsageDesc
	ch <- workerHealthyDesc
	ch <- workerRoleDesc
	ch <- activeWorkersDesc
}

func (c poolCollector) Collect(ch chan<- prometheus.Metric) {
	active := 0
	engine := c.pool.LoadSignal() == workers.SignalEngine
	now := time.Now()
	for _, w := range c.pool.All() {
		healthy := 0.0
		if w.Healthy() {
			healthy = 1
		}
		if w.Available() {
			active++
		}
		ch <- prometheus.MustNewConstMetric(workerLoadDesc, prometheus.GaugeValue, float64(w.InFlight()), w.Name())
		ch <- prometheus.MustNewConstMetric(workerLoadSignalDesc, prometheus.GaugeValue, float64(w.Load()), w.Name())
		if engine {
			ch <- prometheus.MustNewConstMetric(workerScrapeErrorsDesc, prometheus.CounterValue, float64(w.ScrapeErrors()), w.Name())
			if at, ok := w.LastScrape(); ok {
				ch <- prometheus.MustNewConstMetric(workerMetricsAgeDesc, prometheus.GaugeValue, now.Sub(at).Seconds(), w.Name())
			}
			if st, _, ok := w.Engine(); ok && st.HasKVCacheUsage {
				ch <- prometheus.MustNewConstMetric(workerKVCacheUsageDesc, prometheus.GaugeValue, st.KVCacheUsage, w.Name())
			}
		}
		ch <- prometheus.MustNewConstMetric(workerHealthyDesc, prometheus.GaugeValue, healthy, w.Name())
		ch <- prometheus.MustNewConstMetric(workerRoleDesc, prometheus.GaugeValue, 1, w.Name(), w.Role().String())
	}
	ch <- prometheus.MustNewConstMetric(activeWorkersDesc, prometheus.GaugeValue, float64(active))
}

// The KV-cache event streams, one series per subscribed worker tenant (--kv-events-endpoint).
var (
	kvBatchesDesc = prometheus.NewDesc(namespace+"_kv_events_batches_total",
		"KV-cache event batches applied from each worker's stream.", []string{"worker"}, nil)
	kvEventsDesc = prometheus.NewDesc(namespace+"_kv_events_total",
		"KV-cache events (blocks stored, removed, all cleared) applied from each worker's stream.", []string{"worker"}, nil)
	kvDecodeErrorsDesc = prometheus.NewDesc(namespace+"_kv_events_decode_errors_total",
		"Messages of each worker's stream that were not an event batch.", []string{"worker"}, nil)
	kvGapsDesc = prometheus.NewDesc(namespace+"_kv_events_gaps_total",
		"Jumps in each worker's sequence numbers: batches the stream dropped.", []string{"worker"}, nil)
	kvReplaysDesc = prometheus.NewDesc(namespace+"_kv_events_replays_total",
		"Replays asked of each worker's replay endpoint.", []string{"worker"}, nil)
	kvResyncsDesc = prometheus.NewDesc(namespace+"_kv_events_resyncs_total",
		"Times each worker's index was forgotten: a gap not repaired, or its publisher restarted.", []string{"worker"}, nil)
	kvOrphansDesc = prometheus.NewDesc(namespace+"_kv_events_orphaned_blocks_total",
		"Blocks each worker's stream stored that were not indexed: their parent block was never seen, or they came without their tokens.", []string{"worker"}, nil)
	kvBlocksDesc = prometheus.NewDesc(namespace+"_kv_events_index_blocks",
		"Blocks the index holds for each worker.", []string{"worker"}, nil)
	kvCompleteDesc = prometheus.NewDesc(namespace+"_kv_events_complete",
		"1 when the index has every batch of the worker's publisher since its first, else 0.", []string{"worker"}, nil)
	kvAgeDesc = prometheus.NewDesc(namespace+"_kv_events_last_batch_age_seconds",
		"Seconds since the last batch of each worker's stream; no series before the first.", []string{"worker"}, nil)
	kvUnknownTopicDesc = prometheus.NewDesc(namespace+"_kv_events_unknown_topic_total",
		"Messages on the --kv-events-bind endpoint whose topic named no worker of the fleet, dropped.", nil, nil)
	kvDroppedDesc = prometheus.NewDesc(namespace+"_kv_events_dropped_connections_total",
		"Event publishers' connections the router closed, dialled or accepted on --kv-events-bind, by reason: oversized (a frame or message over its bound), handshake_timeout (no ZMTP handshake within 5 s), connection_limit (accepted while the bound endpoint held its most).", []string{"reason"}, nil)
	kvIndexBytesDesc = prometheus.NewDesc(namespace+"_kv_events_index_bytes",
		"Bytes the KV-event block index counts against --kv-events-index-size, all workers.", nil, nil)
)

// kvEventsCollector reads the subscriptions at scrape time.
type kvEventsCollector struct{ source atomic.Pointer[KVEvents] }

func (c *kvEventsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{kvBatchesDesc, kvEventsDesc, kvDecodeErrorsDesc, kvGapsDesc, kvReplaysDesc,
		kvResyncsDesc, kvOrphansDesc, kvBlocksDesc, kvCompleteDesc, kvAgeDesc, kvIndexBytesDesc, kvUnknownTopicDesc, kvDroppedDesc} {
		ch <- d
	}
}

func (c *kvEventsCollector) Collect(ch chan<- prometheus.Metric) {
	source := c.source.Load()
	if source == nil {
		return
	}
	now := time.Now()
	for _, st := range (*source).Status() {
		counter := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), st.Worker.Redacted())
		}
		counter(kvBatchesDesc, st.Batches)
		counter(kvEventsDesc, st.Events)
		counter(kvDecodeErrorsDesc, st.DecodeErrors)
		counter(kvGapsDesc, st.Gaps)
		counter(kvReplaysDesc, st.Replays)
		counter(kvResyncsDesc, st.Resyncs)
		counter(kvOrphansDesc, st.Orphans)
		ch <- prometheus.MustNewConstMetric(kvBlocksDesc, prometheus.GaugeValue, float64(st.Blocks), st.Worker.Redacted())
		complete := 0.0
		if st.Complete {
			complete = 1
		}
		ch <- prometheus.MustNewConstMetric(kvCompleteDesc, prometheus.GaugeValue, complete, st.Worker.Redacted())
		if !st.LastEvent.IsZero() {
			ch <- prometheus.MustNewConstMetric(kvAgeDesc, prometheus.GaugeValue, now.Sub(st.LastEvent).Seconds(), st.Worker.Redacted())
		}
	}
	ch <- prometheus.MustNewConstMetric(kvIndexBytesDesc, prometheus.GaugeValue, float64((*source).Index().Bytes()))
	ch <- prometheus.MustNewConstMetric(kvUnknownTopicDesc, prometheus.CounterValue, float64((*source).UnknownTopics()))
	d := (*source).DroppedConnections()
	for reason, n := range map[string]int64{"oversized": d.Oversized, "handshake_timeout": d.Handshake, "connection_limit": d.OverLimit} {
		ch <- prometheus.MustNewConstMetric(kvDroppedDesc, prometheus.CounterValue, float64(n), reason)
	}
}
