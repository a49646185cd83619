// Package config holds every knob of the router: its defaults, its command-line flags, the YAML
// file form and validation. Other packages receive a validated Config and never read flags,
// files or the environment themselves.
package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"net/url"
	"os"
	"reflect"
	"slices"
	"strings"
	"time"

	"github.com/spf13/pflag"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/policy/registry"
	"github.com/cacheroute/cacheroute/internal/telemetry"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
	"go.yaml.in/yaml/v3"
)

// Config is the router's whole configuration. YAML keys are the flag names in snake_case.
type Config struct {
	Host       string   `yaml:"host"`
	Port       int      `yaml:"port"`
	WorkerURLs []string `yaml:"worker_urls"`
	Policy     string   `yaml:"policy"`
	DPSize     int      `yaml:"intra_node_data_parallel_size"`
	// PrefillDPSize and DecodeDPSize are the data-parallel ranks per URL of the prefill and
	// decode workers, which are often scaled apart; 0: DPSize.
	PrefillDPSize int `yaml:"prefill_data_parallel_size"`
	DecodeDPSize  int `yaml:"decode_data_parallel_size"`

	// Prefill and Decode are static workers in those roles under prefill/decode
	// disaggregation; WorkerURLs are colocated.
	Prefill []string `yaml:"prefill"`
	Decode  []string `yaml:"decode"`
	// PrefillBootstrapPorts are the bootstrap ports given after --prefill URLs in the vLLM
	// router's form (--prefill URL 9000). The NIXL transfer needs none: they are only reported.
	PrefillBootstrapPorts []BootstrapPort `yaml:"-"`

	// StrictModelMatching refuses (404) a request naming a model no healthy worker lists; by
	// default it is forwarded to the available workers, which answer for themselves.
	StrictModelMatching bool `yaml:"strict_model_matching"`
	// RefuseUnknownPaths answers 404 on a path the router neither routes nor serves itself; by
	// default such a request is forwarded to a worker.
	RefuseUnknownPaths bool `yaml:"refuse_unknown_paths"`

	// Worker discovery (internal/discovery); workers it finds join those of WorkerURLs.
	ServiceDiscovery          bool     `yaml:"service_discovery"`
	Selector                  []string `yaml:"selector"`         // key=value terms, all must match
	PrefillSelector           []string `yaml:"prefill_selector"` // pods of prefill workers
	DecodeSelector            []string `yaml:"decode_selector"`  // pods of decode workers
	ServiceDiscoveryPort      int      `yaml:"service_discovery_port"`
	ServiceDiscoveryNamespace string   `yaml:"service_discovery_namespace"` // empty: the router's own
	Kubeconfig                string   `yaml:"kubeconfig"`                  // empty: in-cluster
	DNSDiscovery              string   `yaml:"dns_discovery"`               // NAME:PORT
	DNSRefreshSecs            float64  `yaml:"dns_refresh_secs"`
	// AllowEmpty lets the router start with no worker and no discovery, to be given its workers
	// through the admin API.
	AllowEmpty bool `yaml:"allow_empty"`

	RequestTimeoutSecs   float64 `yaml:"request_timeout_secs"`
	FirstByteTimeoutSecs float64 `yaml:"first_byte_timeout_secs"`
	// StallTimeoutSecs: a worker with requests in flight that sends no byte for this long is
	// asked a probe request, and out of rotation if that gets no answer as long; 0: never.
	StallTimeoutSecs float64 `yaml:"stall_timeout_secs"`
	MaxPayloadSize   int64   `yaml:"max_payload_size"`
	// MaxBodyBytesTotal bounds the request-body bytes held at once, all requests
	// together; a request over it gets 503 before its body is read. 0: no bound.
	MaxBodyBytesTotal int64 `yaml:"max_request_body_bytes_total"`

	// Client connections on the traffic listener.
	ClientHeaderTimeoutSecs float64 `yaml:"client_header_timeout_secs"`
	ClientBodyTimeoutSecs   float64 `yaml:"client_body_timeout_secs"`
	KeepaliveTimeoutSecs    float64 `yaml:"keepalive_timeout_secs"`
	// ClientWriteTimeoutSecs bounds how long a client may take no byte of its answer; 0 leaves
	// only the request timeout.
	ClientWriteTimeoutSecs float64 `yaml:"client_write_timeout_secs"`
	MaxClientConnections   int     `yaml:"max_client_connections"`
	// MaxConnectionsPerClient caps the open connections of one client address (IPv4 address or
	// IPv6 /64); 0: no cap.
	MaxConnectionsPerClient int `yaml:"max_connections_per_client"`

	// Searches of the workers for stored responses the router does not know (id routes, and
	// Responses turns continuing one): the workers one search asks at once, and the searches
	// each client may start a minute (0: no bound).
	ResponseSearchConcurrency int `yaml:"response_search_concurrency"`
	ResponseSearchPerMinute   int `yaml:"response_search_per_minute"`

	// Admission control (internal/admission): off while both limits and both rates are 0.
	MaxConcurrentRequests int      `yaml:"max_concurrent_requests"`
	MaxInflightPerWorker  int      `yaml:"max_inflight_per_worker"`
	QueueSize             int      `yaml:"queue_size"`
	QueueTimeoutSecs      float64  `yaml:"queue_timeout_secs"`
	PriorityLevels        []string `yaml:"priority_levels"`  // highest first
	PriorityHeader        bool     `yaml:"priority_header"`  // accept x-priority from clients
	PriorityReserve       int      `yaml:"priority_reserve"` // places of max_concurrent_requests only the top level takes
	TenantRPM             int      `yaml:"tenant_requests_per_minute"`
	TenantTPM             int      `yaml:"tenant_tokens_per_minute"`

	HealthCheckIntervalSecs float64 `yaml:"health_check_interval_secs"`
	HealthCheckTimeoutSecs  float64 `yaml:"health_check_timeout_secs"`
	HealthCheckEndpoint     string  `yaml:"health_check_endpoint"`
	HealthFailureThreshold  int     `yaml:"health_failure_threshold"`
	HealthSuccessThreshold  int     `yaml:"health_success_threshold"`

	RetryMaxRetries       int `yaml:"retry_max_retries"`
	RetryInitialBackoffMs int `yaml:"retry_initial_backoff_ms"`
	RetryMaxBackoffMs     int `yaml:"retry_max_backoff_ms"`
	// DisableRetries is --retry-max-retries 0 in the vLLM router's spelling; Load applies it.
	DisableRetries bool `yaml:"disable_retries"`

	CBFailureThreshold    int     `yaml:"cb_failure_threshold"`
	CBTimeoutDurationSecs float64 `yaml:"cb_timeout_duration_secs"`
	DisableCircuitBreaker bool    `yaml:"disable_circuit_breaker"`

	PrometheusHost string `yaml:"prometheus_host"`
	PrometheusPort int    `yaml:"prometheus_port"`

	APIKey      string `yaml:"api_key"`
	AdminAPIKey string `yaml:"admin_api_key"`
	// ClientAPIKeysFile, when set, closes the routed endpoints and /v1/models to callers without
	// one of its keys (see internal/clientkeys for the format).
	ClientAPIKeysFile string `yaml:"client_api_keys_file"`
	// WorkerURLAllow limits the addresses the router connects to as workers (CIDR prefixes or
	// addresses); empty: anywhere.
	WorkerURLAllow []string `yaml:"worker_url_allow"`
	// AdminWorkerURLCredentials lets the admin API add worker URLs carrying user:password@.
	AdminWorkerURLCredentials bool `yaml:"admin_worker_url_credentials"`
	// AccessLog is where the access log goes: a file path, "stdout", or "" for none.
	AccessLog string `yaml:"access_log"`
	// SessionHashSalt keys the session hash of the access log, traces and debug logs; "" draws a
	// random one per process. Replicas given the same salt write the same hash for a session.
	SessionHashSalt string `yaml:"session_hash_salt"`
	// OTLPTracesEndpoint turns tracing on: the http(s):// URL spans are exported to over
	// OTLP/HTTP. Empty: off, unless the OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT environment
	// variables name one.
	OTLPTracesEndpoint string `yaml:"otlp_traces_endpoint"`
	// TraceSampleRatio is the fraction of new traces recorded; requests that bring a trace
	// context follow its sampled flag.
	TraceSampleRatio float64 `yaml:"trace_sample_ratio"`
	// CORSAllowedOrigins are the web origins whose pages may call the router ("*": any).
	CORSAllowedOrigins []string `yaml:"cors_allowed_origins"`
	// AdminAllowedOrigins are the web origins whose pages may send admin requests that change the
	// router (add or remove workers, load adapters); none by default. "*" is not accepted.
	AdminAllowedOrigins []string `yaml:"admin_allowed_origins"`
	// ForwardClientAuth sends the client's own Authorization / x-api-key to the worker even when
	// client keys are checked (by default the worker then gets --api-key only).
	ForwardClientAuth bool `yaml:"forward_client_auth"`

	// TLS. With both files set the traffic and metrics listeners serve TLS (the files are
	// re-read when they change). The worker files shape the connections to https:// workers:
	// the CAs trusted instead of the system roots, and a client certificate for mTLS.
	TLSCertFile          string `yaml:"tls_cert_file"`
	TLSKeyFile           string `yaml:"tls_key_file"`
	WorkerCAFile         string `yaml:"worker_ca_file"`
	WorkerClientCertFile string `yaml:"worker_client_cert_file"`
	WorkerClientKeyFile  string `yaml:"worker_client_key_file"`

	LogLevel  string `yaml:"log_level"`
	LogFormat string `yaml:"log_format"`

	ShutdownGraceSecs float64 `yaml:"shutdown_grace_secs"`

	// Sessions kept by a policy with affinity (cache_aware), in this process or the shared store.
	SessionTTL  time.Duration `yaml:"session_ttl"`
	MaxSessions int           `yaml:"max_sessions"`
	// PolicyOptions are the policies' own knobs, by policy name (registry.Spec.Options): each
	// binds its flags and validates itself; in the YAML file their keys sit at the top level like
	// every other flag's.
	PolicyOptions map[string]registry.Options `yaml:"-"`

	// KV-cache events (internal/kvevents). KVEventsEndpoint, when set, subscribes to every
	// worker's event publisher at this template (tcp://{host}:5557: {host} is the worker URL's
	// host, the port is offset by its data-parallel rank); KVEventsReplayEndpoint is the same for
	// the publishers' replay sockets ("" for none). KVEventsIndexSize bounds the block index of all
	// workers together, in bytes.
	KVEventsEndpoint       string `yaml:"kv_events_endpoint"`
	KVEventsReplayEndpoint string `yaml:"kv_events_replay_endpoint"`
	KVEventsTopic          string `yaml:"kv_events_topic"`
	KVEventsIndexSize      int    `yaml:"kv_events_index_size"`
	// KVEventsWorkerEndpoints name the event endpoint of single workers (worker URL → endpoint),
	// in place of the template: workers on one host each publish on a port of their own.
	KVEventsWorkerEndpoints map[string]string `yaml:"kv_events_worker_endpoints"`
	// KVEventsBind, when set, is an endpoint (tcp://HOST:PORT) the router binds for publishers
	// that dial it, each message's topic naming its worker: through KVEventsBindTopics
	// (topic → worker URL), else in llm-d's form kv@HOST:PORT@MODEL, the worker with that host:port.
	KVEventsBind       string            `yaml:"kv_events_bind"`
	KVEventsBindTopics map[string]string `yaml:"kv_events_bind_topics"`
	// TokenizeTimeoutSecs bounds the wait for an engine's /tokenize, asked for the requests
	// cache_aware matches against the KV-cache events.
	TokenizeTimeoutSecs float64 `yaml:"tokenize_timeout_secs"`
	// TokenizeTimeoutPerKiBMs is added to that bound for each KiB of the /tokenize request, so
	// that a long prompt, which takes the engine longer to render and tokenize, gets its answer.
	TokenizeTimeoutPerKiBMs float64 `yaml:"tokenize_timeout_per_kib_ms"`
	// TokenizeURL, when set, is the base URL of a render service (an engine of the same model and
	// chat template, GPU or not) asked for every /tokenize in place of a worker, so routing adds
	// no work to the workers.
	TokenizeURL string `yaml:"tokenize_url"`

	// Prefill/decode disaggregation (internal/proxy/pd.go): PDDisaggregation turns it on for the
	// workers whose role is prefill or decode; PrefillPolicy and DecodePolicy choose each side
	// ("": --policy); a decode worker predicted to compute fewer than PDMinUncachedTokens of a
	// prompt computes them itself; KVConnector names the engines' KV-transfer protocol.
	PDDisaggregation    bool   `yaml:"vllm_pd_disaggregation"`
	PrefillPolicy       string `yaml:"prefill_policy"`
	DecodePolicy        string `yaml:"decode_policy"`
	PDMinUncachedTokens int    `yaml:"pd_min_uncached_tokens"`
	KVConnector         string `yaml:"kv_connector"`

	// Load signal: what the policies read as a worker's load (LoadSignals), the engine metrics'
	// scrape period, and the prompt tokens one unit of load is worth.
	LoadSignal            string        `yaml:"load_signal"`
	WorkerMetricsInterval time.Duration `yaml:"worker_metrics_interval"`
	LoadUnitTokens        int           `yaml:"load_unit_tokens"`
	KVCapacityTokens      int64         `yaml:"kv_capacity_tokens"`

	// Shared session store.
	SessionStore   string        `yaml:"session_store"`
	RedisURL       string        `yaml:"redis_url"`
	RedisKeyPrefix string        `yaml:"redis_key_prefix"`
	RedisTimeout   time.Duration `yaml:"redis_timeout"`
	// RedisCAFile, with a rediss:// URL, holds the CAs trusted for Redis instead of the system roots.
	RedisCAFile string `yaml:"redis_ca_file"`

	// What one client may make the router hold: the request-body bytes its requests hold at once
	// (a client is its key's tenant, else its address; MaxBodyBytesTotal bounds all together).
	// And the searches for unknown stored responses all clients together may start a second
	// (ResponseSearchPerMinute bounds each client's). 0: no bound.
	MaxBodyBytesPerClient        int64   `yaml:"max_request_body_bytes_per_client"`
	ResponseSearchTotalPerSecond float64 `yaml:"response_search_total_per_second"`
}

// Secrets read from the environment when their flag is not given, so they stay out of process lists.
const (
	APIKeyEnv      = "CACHEROUTE_API_KEY"
	AdminAPIKeyEnv = "CACHEROUTE_ADMIN_API_KEY"
	RedisURLEnv    = "CACHEROUTE_REDIS_URL"
)

// MinWorkerMetricsInterval is the shortest --worker-metrics-interval: a scrape of every worker
// more often than this costs more than its fresher figures are worth.
const MinWorkerMetricsInterval = 10 * time.Millisecond

// SessionHashSaltEnv is read for --session-hash-salt when neither the flag nor the file sets it.
const SessionHashSaltEnv = "CACHEROUTE_SESSION_HASH_SALT"

// Admission reports whether any admission control is configured.
func (c Config) Admission() bool {
	return c.MaxConcurrentRequests > 0 || c.MaxInflightPerWorker > 0 || c.TenantRPM > 0 || c.TenantTPM > 0
}

// QueueTimeout is --queue-timeout-secs.
func (c Config) QueueTimeout() time.Duration { return secs(c.QueueTimeoutSecs) }

// LoadSignals lists the accepted --load-signal values.
var (
	LoadSignals = []string{workers.SignalRequests, workers.SignalTokens, workers.SignalEngine}
)

// SessionStores lists the accepted --session-store values.
var SessionStores = []string{"memory", "redis"}

// Default returns the configuration used when nothing is set.
func Default() Config {
	return Config{
		Host:                    "127.0.0.1",
		Port:                    30000,
		Policy:                  registry.Default(),
		DPSize:                  1,
		ServiceDiscoveryPort:    8000,
		DNSRefreshSecs:          5,
		RequestTimeoutSecs:      1800,
		FirstByteTimeoutSecs:    60,
		StallTimeoutSecs:        30,
		MaxPayloadSize:          33554432,
		MaxBodyBytesTotal:       1 << 30,
		ClientHeaderTimeoutSecs: 10,
		ClientBodyTimeoutSecs:   60,
		KeepaliveTimeoutSecs:    75,
		ClientWriteTimeoutSecs:  60,
		MaxClientConnections:    10000,
		MaxConnectionsPerClient: 1000,
		QueueSize:               1024,
		QueueTimeoutSecs:        30,
		PriorityLevels:          []string{"default"},
		HealthCheckIntervalSecs: 10,
		HealthCheckTimeoutSecs:  5,
		HealthCheckEndpoint:     "/health",
		HealthFailureThreshold:  3,
		HealthSuccessThreshold:  2,
		RetryMaxRetries:         3,
		RetryInitialBackoffMs:   50,
		RetryMaxBackoffMs:       2000,
		CBFailureThreshold:      10,
		CBTimeoutDurationSecs:   30,
		PrometheusHost:          "127.0.0.1",
		PrometheusPort:          29000,
		LogLevel:                "info",
		LogFormat:               "text",
		TraceSampleRatio:        1,
		ShutdownGraceSecs:       30,
		KVEventsIndexSize:       67108864,
		TokenizeTimeoutSecs:     0.1,
		TokenizeTimeoutPerKiBMs: 0.5,
		PDMinUncachedTokens:     256,
		KVConnector:             KVConnectorNIXL,
		SessionTTL:              time.Hour,
		MaxSessions:             1048576,
		LoadSignal:              workers.SignalEngine,
		WorkerMetricsInterval:   100 * time.Millisecond,
		LoadUnitTokens:          workers.DefaultLoadUnitTokens,
		SessionStore:            "memory",
		RedisKeyPrefix:          "cacheroute",
		RedisTimeout:            50 * time.Millisecond,
		PolicyOptions:           policyDefaults(),

		ResponseSearchConcurrency: 4,
		ResponseSearchPerMinute:   600,

		MaxBodyBytesPerClient:        256 << 20,
		ResponseSearchTotalPerSecond: 50,
	}
}

// policyDefaults are every registered policy's knobs at their defaults, by policy name.
func policyDefaults() map[string]registry.Options {
	out := map[string]registry.Options{}
	for _, s := range registry.Specs() {
		if s.Options != nil {
			out[s.Name] = s.Options()
		}
	}
	return out
}

// BindFlags registers every knob on fs, writing into c. The flag defaults are c's current values,
// so binding onto a Config loaded from a file keeps the file's values for flags not given.
func BindFlags(fs *pflag.FlagSet, c *Config) {
	fs.StringVar(&c.Host, "host", c.Host, "listen address")
	fs.IntVar(&c.Port, "port", c.Port, "listen port")
	fs.Var(&urlList{list: &c.WorkerURLs}, "worker-urls", "worker base URLs: space-separated after the flag, comma-separated, or the flag repeated")
	fs.Var(&urlList{list: &c.Prefill, bootstrap: &c.PrefillBootstrapPorts}, "prefill", "prefill worker base URLs under prefill/decode disaggregation (--vllm-pd-disaggregation), listed as --worker-urls; the vLLM router's bootstrap port after a URL (--prefill URL 9000, or none) is taken and not used")
	fs.Var(&urlList{list: &c.Decode}, "decode", "decode worker base URLs under prefill/decode disaggregation (--vllm-pd-disaggregation), listed as --worker-urls")
	fs.StringVar(&c.Policy, "policy", c.Policy, "routing policy: "+strings.Join(registry.Names(), ", "))
	fs.IntVar(&c.DPSize, "intra-node-data-parallel-size", c.DPSize, "data-parallel ranks per worker URL; each becomes a tenant URL@rank routed with header X-data-parallel-rank")
	fs.IntVar(&c.PrefillDPSize, "prefill-data-parallel-size", c.PrefillDPSize, "data-parallel ranks per prefill worker URL (0: --intra-node-data-parallel-size)")
	fs.IntVar(&c.DecodeDPSize, "decode-data-parallel-size", c.DecodeDPSize, "data-parallel ranks per decode worker URL (0: --intra-node-data-parallel-size)")
	fs.BoolVar(&c.StrictModelMatching, "strict-model-matching", c.StrictModelMatching, "refuse (404 model_not_found) a request naming a model no healthy worker lists, instead of forwarding it to the workers")
	fs.BoolVar(&c.RefuseUnknownPaths, "refuse-unknown-paths", c.RefuseUnknownPaths, "answer 404 on a path the router neither routes nor serves itself, instead of forwarding it to a worker")
	fs.BoolVar(&c.ServiceDiscovery, "service-discovery", c.ServiceDiscovery, "find workers among the Kubernetes pods that match --selector: a Ready pod joins, a NotReady or terminating one is drained, a deleted one leaves")
	fs.StringSliceVar(&c.Selector, "selector", c.Selector, "label selector of the worker pods, key=value terms (space-separated after the flag, comma-separated, or the flag repeated); all must match")
	fs.StringSliceVar(&c.PrefillSelector, "prefill-selector", c.PrefillSelector, "label selector of the prefill worker pods under prefill/decode disaggregation, as --selector")
	fs.StringSliceVar(&c.DecodeSelector, "decode-selector", c.DecodeSelector, "label selector of the decode worker pods under prefill/decode disaggregation, as --selector")
	fs.IntVar(&c.ServiceDiscoveryPort, "service-discovery-port", c.ServiceDiscoveryPort, "port of the discovered pods' HTTP server")
	fs.StringVar(&c.ServiceDiscoveryNamespace, "service-discovery-namespace", c.ServiceDiscoveryNamespace, "namespace watched for worker pods (default: the router's own, from its service account, else default)")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", c.Kubeconfig, "kubeconfig file for --service-discovery (default: the in-cluster service account)")
	fs.StringVar(&c.DNSDiscovery, "dns-discovery", c.DNSDiscovery, "NAME:PORT: every A/AAAA address of NAME (e.g. a headless Service) is a worker on PORT")
	fs.Float64Var(&c.DNSRefreshSecs, "dns-refresh-secs", c.DNSRefreshSecs, "seconds between lookups of --dns-discovery")
	fs.BoolVar(&c.AllowEmpty, "allow-empty", c.AllowEmpty, "start with no worker and no discovery; workers are then added through the admin API (POST /workers)")
	fs.Float64Var(&c.RequestTimeoutSecs, "request-timeout-secs", c.RequestTimeoutSecs, "upstream request timeout in seconds")
	fs.Float64Var(&c.FirstByteTimeoutSecs, "first-byte-timeout-secs", c.FirstByteTimeoutSecs, "seconds a request waits for a worker's response headers, streamed or not, all attempts together (from the first); past it 504, and a worker that sent no byte of any answer for as long is out of rotation until it answers a probe request (0 disables; at most --request-timeout-secs)")
	fs.Float64Var(&c.StallTimeoutSecs, "stall-timeout-secs", c.StallTimeoutSecs, "seconds a worker with requests in flight may send no byte before it is sent a probe request; one that does not answer that as long is out of rotation, and its attempts still waiting for a first byte go elsewhere (0 disables)")
	fs.Int64Var(&c.MaxPayloadSize, "max-payload-size", c.MaxPayloadSize, "largest accepted request body in bytes; larger bodies get 413")
	fs.Int64Var(&c.MaxBodyBytesTotal, "max-request-body-bytes-total", c.MaxBodyBytesTotal, "request-body bytes held at once, all requests together, counted as they arrive, each byte twice (the body, and the copy routing derives from it) until the request is parsed; a request over it gets 503 with Retry-After (0: no bound)")
	fs.Float64Var(&c.ClientHeaderTimeoutSecs, "client-header-timeout-secs", c.ClientHeaderTimeoutSecs, "seconds a client has to send a request's headers (and a new connection its first request line)")
	fs.Float64Var(&c.ClientBodyTimeoutSecs, "client-body-timeout-secs", c.ClientBodyTimeoutSecs, "seconds a client has to send the whole request body once its headers arrived")
	fs.Float64Var(&c.KeepaliveTimeoutSecs, "keepalive-timeout-secs", c.KeepaliveTimeoutSecs, "seconds an idle keep-alive client connection is kept open")
	fs.Float64Var(&c.ClientWriteTimeoutSecs, "client-write-timeout-secs", c.ClientWriteTimeoutSecs, "seconds a client may take no byte of its answer before it is cut and the worker's request aborted (0: only --request-timeout-secs)")
	fs.IntVar(&c.MaxClientConnections, "max-client-connections", c.MaxClientConnections, "open client connections on the traffic listener; above it new connections get 503 and are closed")
	fs.IntVar(&c.ResponseSearchConcurrency, "response-search-concurrency", c.ResponseSearchConcurrency, "workers asked at once when looking for a stored response the router does not know (GET/DELETE /v1/responses/{id}, cancel, input_items, a previous_response_id)")
	fs.IntVar(&c.ResponseSearchPerMinute, "response-search-per-minute", c.ResponseSearchPerMinute, "searches for unknown stored responses each client (its key's tenant, else its address) may start a minute, a minute's worth at once; past it 429 (0: no bound)")
	fs.IntVar(&c.MaxConnectionsPerClient, "max-connections-per-client", c.MaxConnectionsPerClient, "open connections from one client address (IPv4 address, IPv6 /64) on the traffic listener; above it a new connection gets 429 and is closed (0: no cap; behind a proxy every client has the proxy's address)")
	fs.IntVar(&c.MaxConcurrentRequests, "max-concurrent-requests", c.MaxConcurrentRequests, "routed requests in flight at once, router-wide; more wait in the queue (0: unlimited)")
	fs.IntVar(&c.MaxInflightPerWorker, "max-inflight-per-worker", c.MaxInflightPerWorker, "requests in flight per worker; a request waits in the queue while every worker of its model is at it (0: unlimited)")
	fs.IntVar(&c.QueueSize, "queue-size", c.QueueSize, "requests waiting for admission, all priorities together; above it 429 (0: none wait)")
	fs.Float64Var(&c.QueueTimeoutSecs, "queue-timeout-secs", c.QueueTimeoutSecs, "longest wait in the admission queue before 429")
	fs.StringSliceVar(&c.PriorityLevels, "priority-levels", c.PriorityLevels, "admission priority levels, highest first; a client key's priority= or x-priority names one")
	fs.IntVar(&c.PriorityReserve, "priority-reserve", c.PriorityReserve, "places of --max-concurrent-requests that only the highest priority level may take, so it rarely waits behind lower ones")
	fs.BoolVar(&c.PriorityHeader, "priority-header", c.PriorityHeader, "let clients choose their priority level with the x-priority header (a client key's own priority wins)")
	fs.IntVar(&c.TenantRPM, "tenant-requests-per-minute", c.TenantRPM, "requests per minute per tenant (client keys' tenant=, else one tenant for all); 0: unlimited")
	fs.IntVar(&c.TenantTPM, "tenant-tokens-per-minute", c.TenantTPM, "prompt and max output tokens per minute per tenant, estimated from the body; 0: unlimited")
	fs.Float64Var(&c.HealthCheckIntervalSecs, "health-check-interval-secs", c.HealthCheckIntervalSecs, "seconds between active health checks of each worker")
	fs.Float64Var(&c.HealthCheckTimeoutSecs, "health-check-timeout-secs", c.HealthCheckTimeoutSecs, "timeout of one health check in seconds")
	fs.StringVar(&c.HealthCheckEndpoint, "health-check-endpoint", c.HealthCheckEndpoint, "path probed on each worker by health checks")
	fs.IntVar(&c.HealthFailureThreshold, "health-failure-threshold", c.HealthFailureThreshold, "consecutive failed checks that mark a worker unhealthy")
	fs.IntVar(&c.HealthSuccessThreshold, "health-success-threshold", c.HealthSuccessThreshold, "consecutive passed checks that mark an unhealthy worker healthy again")
	fs.IntVar(&c.RetryMaxRetries, "retry-max-retries", c.RetryMaxRetries, "retries on another worker, only while nothing was sent to the client")
	fs.IntVar(&c.RetryInitialBackoffMs, "retry-initial-backoff-ms", c.RetryInitialBackoffMs, "backoff before the first retry in milliseconds (doubles each retry)")
	fs.IntVar(&c.RetryMaxBackoffMs, "retry-max-backoff-ms", c.RetryMaxBackoffMs, "largest backoff between retries in milliseconds")
	fs.BoolVar(&c.DisableRetries, "disable-retries", c.DisableRetries, "no retries: --retry-max-retries 0")
	fs.IntVar(&c.CBFailureThreshold, "cb-failure-threshold", c.CBFailureThreshold, "consecutive request failures (connection errors, 5xx) that open a worker's circuit breaker")
	fs.Float64Var(&c.CBTimeoutDurationSecs, "cb-timeout-duration-secs", c.CBTimeoutDurationSecs, "seconds an open breaker waits before letting one trial request through")
	fs.BoolVar(&c.DisableCircuitBreaker, "disable-circuit-breaker", c.DisableCircuitBreaker, "never open circuit breakers")
	fs.StringVar(&c.PrometheusHost, "prometheus-host", c.PrometheusHost, "listen address of the separate metrics listener")
	fs.IntVar(&c.PrometheusPort, "prometheus-port", c.PrometheusPort, "port of the separate metrics listener (0 disables it; /metrics is also on the main port, for admins)")
	fs.StringVar(&c.APIKey, "api-key", c.APIKey, "sent to workers as 'Authorization: Bearer' when the client sent none (env "+APIKeyEnv+")")
	fs.StringVar(&c.AdminAPIKey, "admin-api-key", c.AdminAPIKey, "when set, admin endpoints require 'Authorization: Bearer <key>' (env "+AdminAPIKeyEnv+")")
	fs.StringVar(&c.AccessLog, "access-log", c.AccessLog, "write one JSON line per routed request to this file (appended), or stdout; none by default")
	fs.StringVar(&c.SessionHashSalt, "session-hash-salt", c.SessionHashSalt, "salt of the session hash in the access log, traces and debug logs; give replicas the same one for hashes that agree (default: random per process; env "+SessionHashSaltEnv+")")
	fs.StringVar(&c.OTLPTracesEndpoint, "otlp-traces-endpoint", c.OTLPTracesEndpoint, "export OpenTelemetry traces here over OTLP/HTTP: http(s)://host:4318 (path /v1/traces by default); off by default (the OTEL_EXPORTER_OTLP_* variables also turn it on)")
	fs.Float64Var(&c.TraceSampleRatio, "trace-sample-ratio", c.TraceSampleRatio, "fraction of new traces recorded (0..1); a request with a traceparent follows its caller's decision")
	fs.StringSliceVar(&c.CORSAllowedOrigins, "cors-allowed-origins", c.CORSAllowedOrigins, "web origins (scheme://host[:port], or *) whose pages may call the router from a browser; none: no CORS headers")
	fs.StringSliceVar(&c.AdminAllowedOrigins, "admin-allowed-origins", c.AdminAllowedOrigins, "web origins (scheme://host[:port]) whose pages may send admin requests that change the router; none: every such request that carries an Origin or Referer is refused")
	fs.BoolVar(&c.AdminWorkerURLCredentials, "admin-worker-url-credentials", c.AdminWorkerURLCredentials, "let the admin API add worker URLs with user:password@ (those of --worker-urls and the config file always may)")
	fs.StringSliceVar(&c.WorkerURLAllow, "worker-url-allow", c.WorkerURLAllow, "CIDR prefixes or addresses the router may connect to as workers, checked on every dial after name resolution (empty: anywhere)")
	fs.StringVar(&c.ClientAPIKeysFile, "client-api-keys-file", c.ClientAPIKeysFile, "file of client API keys (one per line, optional tenant= and priority=); when set, routed endpoints require one (reloaded on change and SIGHUP)")
	fs.BoolVar(&c.ForwardClientAuth, "forward-client-auth", c.ForwardClientAuth, "with --client-api-keys-file, still send the client's Authorization / x-api-key to workers")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", c.TLSCertFile, "PEM certificate (chain) of the traffic and metrics listeners; with --tls-key-file they serve TLS 1.2 or later (re-read when the files change and on SIGHUP)")
	fs.StringVar(&c.TLSKeyFile, "tls-key-file", c.TLSKeyFile, "PEM private key of --tls-cert-file")
	fs.StringVar(&c.WorkerCAFile, "worker-ca-file", c.WorkerCAFile, "PEM bundle of the CAs trusted for https:// workers, instead of the system roots")
	fs.StringVar(&c.WorkerClientCertFile, "worker-client-cert-file", c.WorkerClientCertFile, "PEM client certificate presented to https:// workers that ask for one (mTLS); needs --worker-client-key-file")
	fs.StringVar(&c.WorkerClientKeyFile, "worker-client-key-file", c.WorkerClientKeyFile, "PEM private key of --worker-client-cert-file")
	fs.StringVar(&c.LogLevel, "log-level", c.LogLevel, "debug, info, warn or error")
	fs.StringVar(&c.LogFormat, "log-format", c.LogFormat, "text or json")
	fs.Float64Var(&c.ShutdownGraceSecs, "shutdown-grace-secs", c.ShutdownGraceSecs, "on SIGTERM/SIGINT, seconds to let in-flight requests finish")
	fs.StringVar(&c.KVEventsEndpoint, "kv-events-endpoint", c.KVEventsEndpoint, "subscribe to every worker's KV-cache event publisher at this ZMQ endpoint template, e.g. tcp://{host}:5557 ({host}: the worker's host; the port is offset by its data-parallel rank); none: no subscription")
	fs.StringToStringVar(&c.KVEventsWorkerEndpoints, "kv-events-worker-endpoints", c.KVEventsWorkerEndpoints, "per-worker KV-cache event endpoints, URL=tcp://HOST:PORT,…, in place of --kv-events-endpoint's template for those workers")
	fs.StringVar(&c.KVEventsReplayEndpoint, "kv-events-replay-endpoint", c.KVEventsReplayEndpoint, "the publishers' replay (ROUTER) endpoint template, asked for batches a gap lost, for dialled and --kv-events-bind streams alike; none: a gap forgets that worker's index")
	fs.StringVar(&c.KVEventsBind, "kv-events-bind", c.KVEventsBind, "bind this ZMQ endpoint, tcp://HOST:PORT, for KV-cache event publishers that dial the router; a message's topic names its worker (--kv-events-bind-topics, else kv@HOST:PORT@MODEL)")
	fs.StringToStringVar(&c.KVEventsBindTopics, "kv-events-bind-topics", c.KVEventsBindTopics, "with --kv-events-bind: topics naming workers, TOPIC=WORKER_URL,…; ahead of the kv@HOST:PORT@MODEL form")
	fs.StringVar(&c.KVEventsTopic, "kv-events-topic", c.KVEventsTopic, "topic prefix subscribed to on each publisher; empty: every message")
	fs.IntVar(&c.KVEventsIndexSize, "kv-events-index-size", c.KVEventsIndexSize, "bytes of the KV-event block index, all workers together")
	fs.StringVar(&c.TokenizeURL, "tokenize-url", c.TokenizeURL, "with KV-cache events: ask this render service's /tokenize (an engine of the workers' model and chat template) instead of the least loaded worker's")
	fs.Float64Var(&c.TokenizeTimeoutSecs, "tokenize-timeout-secs", c.TokenizeTimeoutSecs, "with KV-cache events: the wait for an engine's /tokenize of a request without session id, plus --tokenize-timeout-per-kib-ms for each KiB asked; past it the prefix tree routes the request")
	fs.Float64Var(&c.TokenizeTimeoutPerKiBMs, "tokenize-timeout-per-kib-ms", c.TokenizeTimeoutPerKiBMs, "with KV-cache events: milliseconds added to --tokenize-timeout-secs for each KiB of the /tokenize request, so that long prompts are not cut off")
	fs.BoolVar(&c.PDDisaggregation, "vllm-pd-disaggregation", c.PDDisaggregation, "prefill/decode disaggregation: chat completions and completions are prefilled on a prefill worker and decoded on a decode worker, over vLLM's KV transfer")
	fs.StringVar(&c.PrefillPolicy, "prefill-policy", c.PrefillPolicy, "with --vllm-pd-disaggregation: the policy that chooses the prefill worker (default: --policy)")
	fs.StringVar(&c.DecodePolicy, "decode-policy", c.DecodePolicy, "with --vllm-pd-disaggregation: the policy that chooses the decode worker (default: --policy)")
	fs.IntVar(&c.PDMinUncachedTokens, "pd-min-uncached-tokens", c.PDMinUncachedTokens, "with --vllm-pd-disaggregation: a decode worker predicted to compute fewer of a prompt's tokens than this (a continuation of its own session, a short prompt) computes them itself, without a transfer")
	fs.StringVar(&c.KVConnector, "kv-connector", c.KVConnector, "with --vllm-pd-disaggregation: the engines' KV-transfer protocol: nixl")
	fs.DurationVar(&c.SessionTTL, "session-ttl", c.SessionTTL, "cache_aware: idle time after which a session entry expires")
	fs.IntVar(&c.MaxSessions, "max-sessions", c.MaxSessions, "cache_aware: session entries held in this process, all models together (least recently used evicted)")
	fs.StringVar(&c.LoadSignal, "load-signal", c.LoadSignal, "the load policies balance on: requests (this router's in flight), tokens (in flight weighted by uncached prompt tokens) or engine (the workers' own running and waiting requests from /metrics, plus this router's sent since)")
	fs.DurationVar(&c.WorkerMetricsInterval, "worker-metrics-interval", c.WorkerMetricsInterval, "with --load-signal engine: period of each worker's /metrics scrape")
	fs.IntVar(&c.LoadUnitTokens, "load-unit-tokens", c.LoadUnitTokens, "uncached prompt tokens worth one request in flight: a match's saving against a holder's load (cost mode), and a prefill's weight in the tokens signal")
	fs.Int64Var(&c.KVCapacityTokens, "kv-capacity-tokens", c.KVCapacityTokens, "tokens each worker's (each data-parallel rank's) KV cache holds, for the engines whose /metrics do not say it (vLLM's cache_config_info, SGLang's max_total_num_tokens); 0: read from the engines")
	fs.StringVar(&c.SessionStore, "session-store", c.SessionStore, "cache_aware session map: memory (this process) or redis (shared by every replica)")
	fs.StringVar(&c.RedisURL, "redis-url", c.RedisURL, "redis:// or rediss:// URL of the shared session store (env "+RedisURLEnv+")")
	fs.StringVar(&c.RedisKeyPrefix, "redis-key-prefix", c.RedisKeyPrefix, "prefix of the session store's Redis keys")
	fs.DurationVar(&c.RedisTimeout, "redis-timeout", c.RedisTimeout, "longest a request waits on the session store before routing without it")
	fs.StringVar(&c.RedisCAFile, "redis-ca-file", c.RedisCAFile, "PEM bundle of the CAs trusted for a rediss:// --redis-url, instead of the system roots")

	fs.Int64Var(&c.MaxBodyBytesPerClient, "max-request-body-bytes-per-client", c.MaxBodyBytesPerClient, "request-body bytes one client's requests hold at once (a client: its key's tenant, else its address), counted as --max-request-body-bytes-total counts them; a request over it gets 429 with Retry-After (0: no bound)")
	fs.Float64Var(&c.ResponseSearchTotalPerSecond, "response-search-total-per-second", c.ResponseSearchTotalPerSecond, "searches for unknown stored responses all clients together may start a second, a second's worth at once (fractions allowed): each asks at most every worker, so the lookups they cost the fleet are at most this times its size a second; past it 503 with Retry-After (0: no bound)")
	for _, name := range slices.Sorted(maps.Keys(c.PolicyOptions)) {
		c.PolicyOptions[name].Bind(fs)
	}
	fs.SetNormalizeFunc(vllmRouterSpelling)
}

// Load resolves the final configuration from parsed flags: defaults, then the YAML file named by
// --config (if any), then every flag given on the command line. The admin key falls back to its
// environment variable, and the vLLM router's spellings of values are taken as it means them
// (takeVLLMRouterValues). The result is validated.
//
// A --request-timeout-secs set below the default --first-byte-timeout-secs turns the first-byte
// deadline off unless that is set too: the default could never fire before the request's own
// deadline, and a configuration written before the first-byte deadline existed keeps working as
// it did. Given explicitly, a first-byte timeout above the request timeout is an error.
func Load(fs *pflag.FlagSet, flagged *Config, configFile string) (Config, error) {
	c := *flagged
	firstByteGiven := fs.Changed("first-byte-timeout-secs")
	if configFile != "" {
		data, err := os.ReadFile(configFile)
		if err != nil {
			return Config{}, fmt.Errorf("--config: %w", err)
		}
		c = Default()
		own, policyKnobs, err := splitPolicyKnobs(data, &c)
		if err != nil {
			return Config{}, fmt.Errorf("--config %s: %w", configFile, err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(own))
		dec.KnownFields(true)
		if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
			return Config{}, fmt.Errorf("--config %s: %w", configFile, err)
		}
		if err := rejectFractionalInts(data); err != nil {
			return Config{}, fmt.Errorf("--config %s: %w", configFile, err)
		}
		if err := policyKnobs(); err != nil {
			return Config{}, fmt.Errorf("--config %s: %w", configFile, err)
		}
		firstByteGiven = firstByteGiven || fileSets(data, "first_byte_timeout_secs")
		// Re-apply the flags the user gave, so they win over the file.
		over := pflag.NewFlagSet("override", pflag.ContinueOnError)
		BindFlags(over, &c)
		var setErr error
		fs.Visit(func(f *pflag.Flag) {
			if over.Lookup(f.Name) == nil || setErr != nil {
				return
			}
			if err := over.Set(f.Name, f.Value.String()); err != nil {
				setErr = fmt.Errorf("--%s: %w", f.Name, err)
			}
		})
		if setErr != nil {
			return Config{}, setErr
		}
	}
	if !firstByteGiven && c.RequestTimeoutSecs > 0 && c.FirstByteTimeoutSecs > c.RequestTimeoutSecs {
		c.FirstByteTimeoutSecs = 0
	}
	if c.APIKey == "" {
		c.APIKey = os.Getenv(APIKeyEnv)
	}
	if c.AdminAPIKey == "" {
		c.AdminAPIKey = os.Getenv(AdminAPIKeyEnv)
	}
	if c.RedisURL == "" {
		c.RedisURL = os.Getenv(RedisURLEnv)
	}
	if c.SessionHashSalt == "" {
		c.SessionHashSalt = os.Getenv(SessionHashSaltEnv)
	}
	c.takeVLLMRouterValues()
	return c, c.Validate()
}

// KVConnectorNIXL is vLLM's NIXL connector, whose two-step protocol the P/D path speaks.
const KVConnectorNIXL = "nixl"

// PolicyFor is the policy of one side of a P/D request: the side's own, else --policy.
func (c Config) PolicyFor(side string) string {
	if side != "" {
		return side
	}
	return c.Policy
}

// RequireWorkerSource is the startup check that the router has a way to get workers: a static
// --worker-urls list, a discovery (Discovery), or --allow-empty for a fleet built through the admin
// API. Without any, every request would be answered 503 by a router that started as if all was
// well. It is apart from Validate because routers built in-process (tests, the bench) start empty
// and add their workers themselves.
func (c Config) RequireWorkerSource() error {
	if len(c.StaticWorkers()) > 0 || c.Discovery() || c.AllowEmpty {
		return nil
	}
	return errors.New("no workers: give their URLs with --worker-urls (or find them with --service-discovery or --dns-discovery), " +
		"or pass --allow-empty to start without any and add them through the admin API (POST /workers)")
}

// splitPolicyKnobs takes the policies' knobs out of the YAML file's top level, where they sit
// like every other flag (their key is the flag name in snake_case): it returns the rest, for the
// Config's own fields, and a function that sets the knobs taken out, in c's policy options, as
// their flags would.
func splitPolicyKnobs(data []byte, c *Config) ([]byte, func() error, error) {
	fs := pflag.NewFlagSet("policies", pflag.ContinueOnError)
	for _, name := range slices.Sorted(maps.Keys(c.PolicyOptions)) {
		c.PolicyOptions[name].Bind(fs)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return data, func() error { return nil }, nil // Decode reports what is wrong with it
	}
	m := doc.Content[0]
	type knob struct{ key, flag, value string }
	var knobs []knob
	kept := m.Content[:0:0]
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		flag := strings.ReplaceAll(k.Value, "_", "-")
		if fs.Lookup(flag) == nil {
			kept = append(kept, k, v)
			continue
		}
		if v.Kind != yaml.ScalarNode {
			return nil, nil, fmt.Errorf("%s (--%s): want a single value", k.Value, flag)
		}
		knobs = append(knobs, knob{k.Value, flag, v.Value})
	}
	m.Content = kept
	rest, err := yaml.Marshal(&doc)
	if err != nil {
		return nil, nil, err
	}
	return rest, func() error {
		for _, k := range knobs {
			if err := fs.Set(k.flag, k.value); err != nil {
				return fmt.Errorf("%s (--%s): %w", k.key, k.flag, err)
			}
		}
		return nil
	}, nil
}

// fileSets reports whether the YAML file has key at its top level.
func fileSets(data []byte, key string) bool {
	var raw map[string]any
	if yaml.Unmarshal(data, &raw) != nil {
		return false
	}
	_, ok := raw[key]
	return ok
}

// rejectFractionalInts fails on an integer knob written as a fraction in the YAML file: the
// decoder would silently truncate "health_failure_threshold: 2.7" to 2, where the flag rejects it.
func rejectFractionalInts(data []byte) error {
	var raw map[string]any
	if yaml.Unmarshal(data, &raw) != nil {
		return nil // Decode has reported it
	}
	typ := reflect.TypeFor[Config]()
	for i := range typ.NumField() {
		f := typ.Field(i)
		if k := f.Type.Kind(); (k != reflect.Int && k != reflect.Int64) || f.Type == reflect.TypeFor[time.Duration]() {
			continue
		}
		key := f.Tag.Get("yaml")
		if v, ok := raw[key].(float64); ok && v != math.Trunc(v) {
			return fmt.Errorf("%s (--%s): %v is not a whole number", key, strings.ReplaceAll(key, "_", "-"), v)
		}
	}
	return nil
}

// Validate checks every value and names the offending flag in its error.
func (c Config) Validate() error {
	var errs []error
	bad := func(flag, format string, args ...any) {
		errs = append(errs, fmt.Errorf("--%s: %s", flag, fmt.Sprintf(format, args...)))
	}
	if _, err := tenant.ParseAllowed(c.WorkerURLAllow); err != nil {
		bad("worker-url-allow", "%v", err)
	}
	if c.Port < 0 || c.Port > 65535 {
		bad("port", "%d is not a port number", c.Port)
	}
	validateStaticWorkers(bad, c)
	validateDiscovery(bad, c)
	if _, ok := registry.Lookup(c.Policy); !ok {
		bad("policy", "%v", registry.Unknown(c.Policy))
	}
	if c.DPSize < 1 {
		bad("intra-node-data-parallel-size", "must be at least 1, got %d", c.DPSize)
	}
	if c.KVCapacityTokens < 0 {
		bad("kv-capacity-tokens", "must not be negative, got %d", c.KVCapacityTokens)
	}
	for flag, n := range map[string]int{"prefill-data-parallel-size": c.PrefillDPSize, "decode-data-parallel-size": c.DecodeDPSize} {
		if n < 0 {
			bad(flag, "must be at least 1, or 0 for --intra-node-data-parallel-size; got %d", n)
		}
	}
	for flag, name := range map[string]string{"prefill-policy": c.PrefillPolicy, "decode-policy": c.DecodePolicy} {
		if _, ok := registry.Lookup(name); name != "" && !ok {
			bad(flag, "%v", registry.Unknown(name))
		}
	}
	if c.KVConnector != KVConnectorNIXL {
		bad("kv-connector", "%q is not supported: the router speaks vLLM's NIXL connector protocol (nixl)", c.KVConnector)
	}
	if c.PDMinUncachedTokens < 0 {
		bad("pd-min-uncached-tokens", "must not be negative, got %d", c.PDMinUncachedTokens)
	}
	positive := map[string]float64{
		"request-timeout-secs":       c.RequestTimeoutSecs,
		"client-header-timeout-secs": c.ClientHeaderTimeoutSecs,
		"client-body-timeout-secs":   c.ClientBodyTimeoutSecs,
		"keepalive-timeout-secs":     c.KeepaliveTimeoutSecs,
		"health-check-interval-secs": c.HealthCheckIntervalSecs,
		"health-check-timeout-secs":  c.HealthCheckTimeoutSecs,
		"cb-timeout-duration-secs":   c.CBTimeoutDurationSecs,
		"session-ttl":                c.SessionTTL.Seconds(),
		"queue-timeout-secs":         c.QueueTimeoutSecs,
		"tokenize-timeout-secs":      c.TokenizeTimeoutSecs,
	}
	checkEach(bad, positive, func(v float64) bool { return v > 0 }, "must be positive")
	atLeastOne := map[string]int{
		"health-failure-threshold": c.HealthFailureThreshold,
		"health-success-threshold": c.HealthSuccessThreshold,
		"cb-failure-threshold":     c.CBFailureThreshold,
		"kv-events-index-size":     c.KVEventsIndexSize,
		"max-sessions":             c.MaxSessions,
		"max-client-connections":   c.MaxClientConnections,
		"load-unit-tokens":         c.LoadUnitTokens,

		"response-search-concurrency": c.ResponseSearchConcurrency,
	}
	checkEach(bad, atLeastOne, func(v int) bool { return v >= 1 }, "must be at least 1")
	nonNegative := map[string]int{
		"retry-max-retries":          c.RetryMaxRetries,
		"retry-initial-backoff-ms":   c.RetryInitialBackoffMs,
		"retry-max-backoff-ms":       c.RetryMaxBackoffMs,
		"max-concurrent-requests":    c.MaxConcurrentRequests,
		"max-connections-per-client": c.MaxConnectionsPerClient,
		"max-inflight-per-worker":    c.MaxInflightPerWorker,
		"queue-size":                 c.QueueSize,
		"tenant-requests-per-minute": c.TenantRPM,
		"tenant-tokens-per-minute":   c.TenantTPM,

		"response-search-per-minute": c.ResponseSearchPerMinute,
	}
	checkEach(bad, nonNegative, func(v int) bool { return v >= 0 }, "must not be negative")
	if !(c.TokenizeTimeoutPerKiBMs >= 0) {
		bad("tokenize-timeout-per-kib-ms", "must not be negative (0: no allowance), got %v", c.TokenizeTimeoutPerKiBMs)
	}
	if !(c.StallTimeoutSecs >= 0) {
		bad("stall-timeout-secs", "must not be negative (0 disables it), got %v", c.StallTimeoutSecs)
	}
	if !(c.ClientWriteTimeoutSecs >= 0) {
		bad("client-write-timeout-secs", "must not be negative (0 disables it), got %v", c.ClientWriteTimeoutSecs)
	}
	if !(c.FirstByteTimeoutSecs >= 0) {
		bad("first-byte-timeout-secs", "must not be negative (0 disables it), got %v", c.FirstByteTimeoutSecs)
	} else if c.RequestTimeoutSecs > 0 && c.FirstByteTimeoutSecs > c.RequestTimeoutSecs {
		bad("first-byte-timeout-secs", "%v exceeds --request-timeout-secs %v, which bounds the whole request", c.FirstByteTimeoutSecs, c.RequestTimeoutSecs)
	}
	if len(c.PriorityLevels) == 0 {
		bad("priority-levels", "needs at least one level")
	}
	if c.PriorityReserve < 0 || (c.PriorityReserve > 0 && c.PriorityReserve >= c.MaxConcurrentRequests) {
		bad("priority-reserve", "must be at least 0 and less than --max-concurrent-requests, got %d", c.PriorityReserve)
	}
	for flag, template := range map[string]string{"kv-events-endpoint": c.KVEventsEndpoint, "kv-events-replay-endpoint": c.KVEventsReplayEndpoint} {
		if _, err := kvevents.Endpoint(template, "worker", 0); template != "" && err != nil {
			bad(flag, "%v", err)
		}
	}
	for worker, ep := range c.KVEventsWorkerEndpoints {
		if _, err := tenant.NormalizeURL(worker); err != nil {
			bad("kv-events-worker-endpoints", "%q: %v", worker, err)
		} else if _, err := kvevents.Endpoint(ep, "worker", 0); err != nil {
			bad("kv-events-worker-endpoints", "%v", err)
		} else if err := (kvevents.WorkerEndpoints{Events: ep}).Check(); err != nil {
			bad("kv-events-worker-endpoints", "%v", err) // as the admin API and pod annotations are checked
		}
	}
	if c.KVEventsBind != "" {
		if err := kvevents.CheckBind(c.KVEventsBind); err != nil {
			bad("kv-events-bind", "%v", err)
		}
	}
	for topic, worker := range c.KVEventsBindTopics {
		if c.KVEventsBind == "" {
			bad("kv-events-bind-topics", "needs --kv-events-bind")
			break
		}
		if _, err := tenant.NormalizeURL(worker); err != nil {
			bad("kv-events-bind-topics", "%q: %v", topic, err)
		}
	}
	if c.TokenizeURL != "" {
		if _, err := tenant.NormalizeURL(c.TokenizeURL); err != nil {
			bad("tokenize-url", "%v", err)
		} else if !c.KVEventsOn() {
			bad("tokenize-url", "tokens are asked only with KV-cache events (--kv-events-endpoint, --kv-events-worker-endpoints or --kv-events-bind)")
		}
	}
	if c.KVEventsReplayEndpoint != "" && c.KVEventsEndpoint == "" && c.KVEventsBind == "" {
		bad("kv-events-replay-endpoint", "needs --kv-events-endpoint or --kv-events-bind")
	}
	for _, o := range c.AdminAllowedOrigins {
		if !isWebOrigin(o) {
			bad("admin-allowed-origins", "%q is not a web origin (scheme://host[:port], no path; * is not accepted)", o)
		}
	}
	if c.MaxPayloadSize < 1 {
		bad("max-payload-size", "must be at least 1 byte, got %d", c.MaxPayloadSize)
	}
	if !(c.ResponseSearchTotalPerSecond >= 0) || math.IsInf(c.ResponseSearchTotalPerSecond, 1) {
		bad("response-search-total-per-second", "must be a non-negative number (0: no bound), got %v", c.ResponseSearchTotalPerSecond)
	}
	// A body counts twice its bytes while it arrives (internal/bodies): a bound must hold the largest twice.
	for flag, bound := range map[string]int64{"max-request-body-bytes-total": c.MaxBodyBytesTotal, "max-request-body-bytes-per-client": c.MaxBodyBytesPerClient} {
		if bound != 0 && (bound < 0 || bound/2 < c.MaxPayloadSize) {
			bad(flag, "must be 0 (no bound) or at least twice --max-payload-size %d (a body and its copy), got %d", c.MaxPayloadSize, bound)
		}
	}
	if c.ShutdownGraceSecs < 0 {
		bad("shutdown-grace-secs", "must not be negative, got %v", c.ShutdownGraceSecs)
	}
	if !slices.Contains(LoadSignals, c.LoadSignal) {
		bad("load-signal", "unknown signal %q (want %s)", c.LoadSignal, strings.Join(LoadSignals, ", "))
	}
	for _, name := range slices.Sorted(maps.Keys(c.PolicyOptions)) {
		errs = append(errs, c.PolicyOptions[name].Validate()...)
	}
	if c.WorkerMetricsInterval < MinWorkerMetricsInterval {
		bad("worker-metrics-interval", "must be at least %v, got %v", MinWorkerMetricsInterval, c.WorkerMetricsInterval)
	}
	if !slices.Contains(SessionStores, c.SessionStore) {
		bad("session-store", "unknown store %q (want memory or redis)", c.SessionStore)
	}
	if c.SessionStore == "redis" {
		if c.RedisURL == "" {
			bad("redis-url", "required with --session-store redis (or set %s)", RedisURLEnv)
		} else if u, err := url.Parse(c.RedisURL); err != nil || (u.Scheme != "redis" && u.Scheme != "rediss") || u.Host == "" {
			bad("redis-url", "want redis://[user:password@]host:port[/db] or rediss://...")
		}
	}
	if c.SessionStore == "redis" && c.RedisCAFile != "" {
		if u, err := url.Parse(c.RedisURL); err == nil && u.Scheme == "redis" {
			bad("redis-ca-file", "needs a rediss:// --redis-url (TLS); the URL given is plain redis://")
		}
	}
	validateTLSFiles(bad, c)
	if c.RedisTimeout <= 0 {
		bad("redis-timeout", "must be positive, got %v", c.RedisTimeout)
	}
	if !strings.HasPrefix(c.HealthCheckEndpoint, "/") {
		bad("health-check-endpoint", "must be a path starting with '/', got %q", c.HealthCheckEndpoint)
	}
	if c.PrometheusPort < 0 || c.PrometheusPort > 65535 {
		bad("prometheus-port", "%d is not a port number", c.PrometheusPort)
	}
	if !slices.Contains([]string{"debug", "info", "warn", "error"}, strings.ToLower(c.LogLevel)) {
		bad("log-level", "unknown level %q (want debug, info, warn or error)", c.LogLevel)
	}
	if c.TraceSampleRatio < 0 || c.TraceSampleRatio > 1 {
		bad("trace-sample-ratio", "%v is not between 0 and 1", c.TraceSampleRatio)
	}
	if e := c.OTLPTracesEndpoint; e != "" {
		if err := telemetry.CheckEndpoint(e); err != nil {
			bad("otlp-traces-endpoint", "%v", err)
		}
	}
	if !slices.Contains([]string{"text", "json"}, c.LogFormat) {
		bad("log-format", "unknown format %q (want text or json)", c.LogFormat)
	}
	return errors.Join(errs...)
}

// validateTLSFiles checks that the certificate and key flags come in pairs and that every file
// named can be read, so a typo fails at startup rather than at the first TLS connection. Their
// contents are parsed by the router, which reports a bad PEM under the same flag names.
func validateTLSFiles(bad func(flag, format string, args ...any), c Config) {
	pairs := []struct{ cert, key, certFlag, keyFlag string }{
		{c.TLSCertFile, c.TLSKeyFile, "tls-cert-file", "tls-key-file"},
		{c.WorkerClientCertFile, c.WorkerClientKeyFile, "worker-client-cert-file", "worker-client-key-file"},
	}
	for _, p := range pairs {
		switch {
		case p.cert != "" && p.key == "":
			bad(p.keyFlag, "required with --%s", p.certFlag)
		case p.cert == "" && p.key != "":
			bad(p.certFlag, "required with --%s", p.keyFlag)
		}
	}
	files := []struct{ flag, path string }{
		{"tls-cert-file", c.TLSCertFile}, {"tls-key-file", c.TLSKeyFile},
		{"worker-ca-file", c.WorkerCAFile},
		{"worker-client-cert-file", c.WorkerClientCertFile}, {"worker-client-key-file", c.WorkerClientKeyFile},
		{"redis-ca-file", c.RedisCAFile},
	}
	for _, f := range files {
		if f.path == "" {
			continue
		}
		if _, err := os.ReadFile(f.path); err != nil {
			bad(f.flag, "cannot read the file: %v", err)
		}
	}
}

// checkEach reports, in flag-name order, every value that breaks the rule ok describes.
func checkEach[V int | float64](bad func(flag, format string, args ...any), values map[string]V, ok func(V) bool, rule string) {
	for _, name := range slices.Sorted(maps.Keys(values)) {
		if !ok(values[name]) {
			bad(name, "%s, got %v", rule, values[name])
		}
	}
}

// Timeouts and intervals as durations, for the packages that use them.
func (c Config) RequestTimeout() time.Duration      { return secs(c.RequestTimeoutSecs) }
func (c Config) ClientHeaderTimeout() time.Duration { return secs(c.ClientHeaderTimeoutSecs) }
func (c Config) ClientBodyTimeout() time.Duration   { return secs(c.ClientBodyTimeoutSecs) }
func (c Config) KeepaliveTimeout() time.Duration    { return secs(c.KeepaliveTimeoutSecs) }
func (c Config) ClientWriteTimeout() time.Duration  { return secs(c.ClientWriteTimeoutSecs) }
func (c Config) HealthCheckInterval() time.Duration { return secs(c.HealthCheckIntervalSecs) }
func (c Config) HealthCheckTimeout() time.Duration  { return secs(c.HealthCheckTimeoutSecs) }
func (c Config) CBTimeout() time.Duration           { return secs(c.CBTimeoutDurationSecs) }
func (c Config) ShutdownGrace() time.Duration       { return secs(c.ShutdownGraceSecs) }

// StallTimeout is zero when --stall-timeout-secs is 0: no stall checks.
func (c Config) StallTimeout() time.Duration { return secs(c.StallTimeoutSecs) }

// FirstByteTimeout is zero when --first-byte-timeout-secs is 0: no first-byte deadline.
func (c Config) FirstByteTimeout() time.Duration { return secs(c.FirstByteTimeoutSecs) }
func (c Config) RetryInitialBackoff() time.Duration {
	return time.Duration(c.RetryInitialBackoffMs) * time.Millisecond
}
func (c Config) RetryMaxBackoff() time.Duration {
	return time.Duration(c.RetryMaxBackoffMs) * time.Millisecond
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// isWebOrigin reports whether o is a web origin as browsers send it in Origin: http or https,
// a host, an optional port, and nothing else.
func isWebOrigin(o string) bool {
	u, err := url.Parse(o)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil &&
		u.Path == "" && u.RawQuery == "" && u.Fragment == "" && !strings.Contains(u.Host, "*")
}

// TokenizeTimeout is --tokenize-timeout-secs.
func (c Config) TokenizeTimeout() time.Duration { return secs(c.TokenizeTimeoutSecs) }

// TokenizeTimeoutPerKiB is --tokenize-timeout-per-kib-ms.
func (c Config) TokenizeTimeoutPerKiB() time.Duration {
	return time.Duration(c.TokenizeTimeoutPerKiBMs * float64(time.Millisecond))
}

// KVEventsOn reports whether the router subscribes to the workers' KV-cache events.
func (c Config) KVEventsOn() bool {
	return c.KVEventsEndpoint != "" || len(c.KVEventsWorkerEndpoints) > 0 || c.KVEventsBind != ""
}
