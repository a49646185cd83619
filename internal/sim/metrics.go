package sim

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// Histogram buckets as vLLM declares them for the same metrics.
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	requestLatencyBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0,
		20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// workerMetrics are the Prometheus collectors of one worker, registered in a
// registry of its own so that many workers can live in one process. Names,
// types and labels follow vLLM: every series carries model_name (the first
// served model) and engine="0". Durations are simulated seconds.
//
// The page is served by promhttp, which honours prometheus_client's name[] query parameters as
// vLLM's own /metrics does: a scraper that names the families it wants (the router's engine load
// signal asks for vllm:num_requests_running and a few more) gets only those.
type workerMetrics struct {
	reg *prometheus.Registry

	prefixQueries    prometheus.Counter
	prefixHits       prometheus.Counter
	externalQueries  prometheus.Counter
	externalHits     prometheus.Counter
	promptTokens     prometheus.Counter
	generationTokens prometheus.Counter
	success          *prometheus.CounterVec
	ttft             prometheus.Observer
	e2e              prometheus.Observer
	queueTime        prometheus.Observer
	preemptions      prometheus.Counter
}

func newWorkerMetrics(w *Worker) *workerMetrics {
	labels := prometheus.Labels{"model_name": w.cfg.Models[0], "engine": "0"}
	m := &workerMetrics{reg: prometheus.NewRegistry()}
	counter := func(name, help string) prometheus.Counter {
		c := prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
		m.reg.MustRegister(c)
		return c
	}
	histogram := func(name, help string, buckets []float64) prometheus.Observer {
		h := prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, Buckets: buckets, ConstLabels: labels})
		m.reg.MustRegister(h)
		return h
	}
	gauge := func(name, help string, f func() float64) {
		m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, f))
	}

	m.prefixQueries = counter("vllm:prefix_cache_queries_total",
		"Prefix cache queries, in terms of number of queried tokens.")
	m.prefixHits = counter("vllm:prefix_cache_hits_total",
		"Prefix cache hits, in terms of number of cached tokens.")
	m.externalQueries = counter("vllm:external_prefix_cache_queries_total",
		"Prompt tokens a decode leg looked for through its KV connector (those its own cache lacked).")
	m.externalHits = counter("vllm:external_prefix_cache_hits_total",
		"Prompt tokens a decode leg pulled from a prefill engine instead of computing them.")
	m.promptTokens = counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.")
	m.generationTokens = counter("vllm:generation_tokens_total", "Number of generation tokens processed.")
	m.preemptions = counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.")
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
	}, []string{"finished_reason"})
	m.reg.MustRegister(m.success)

	m.ttft = histogram("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	m.e2e = histogram("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", requestLatencyBuckets)
	m.queueTime = histogram("vllm:request_queue_time_seconds",
		"Histogram of time spent in WAITING phase for request.", requestLatencyBuckets)

	gauge("vllm:num_requests_running", "Number of requests in model execution batches.", func() float64 {
		r, _ := w.load()
		return float64(r)
	})
	gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func() float64 {
		_, q := w.load()
		return float64(q)
	})
	gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func() float64 {
		w.eng.mu.Lock()
		defer w.eng.mu.Unlock()
		return float64(w.eng.cache.Pinned()) / float64(w.eng.cache.Capacity())
	})

	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info",
		Help: "Information of the LLMEngine CacheConfig.",
		ConstLabels: prometheus.Labels{
			"block_size":            strconv.Itoa(w.cfg.BlockSize),
			"num_gpu_blocks":        strconv.Itoa(w.cfg.KVCacheBlocks),
			"enable_prefix_caching": "True",
		},
	})
	info.Set(1)
	m.reg.MustRegister(info)
	return m
}

// pulled counts a decode leg's look-up of the tokens its own cache lacked, and those it pulled.
func (m *workerMetrics) pulled(queried, pulled int) {
	m.externalQueries.Add(float64(queried))
	m.externalHits.Add(float64(pulled))
}

// admitted counts a request's prompt once it is scheduled.
func (m *workerMetrics) admitted(promptTokens, cachedTokens int) {
	m.prefixQueries.Add(float64(promptTokens))
	m.prefixHits.Add(float64(cachedTokens))
	m.promptTokens.Add(float64(promptTokens))
}
