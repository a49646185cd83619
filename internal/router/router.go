// Package router assembles one cacheroute router from its configuration: the worker pool and its
// health checker, the policy, the metrics and the proxy, and runs it with a graceful shutdown.
package router

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/dashboard"
	"github.com/cacheroute/cacheroute/internal/discovery"
	"github.com/cacheroute/cacheroute/internal/enginemetrics"
	"github.com/cacheroute/cacheroute/internal/fleet"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	_ "github.com/cacheroute/cacheroute/internal/policy/cacheaware" // registers cache_aware
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/responsesearch"
	"github.com/cacheroute/cacheroute/internal/routerapi"
	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/telemetry"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/tokenize"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Router is one running router instance.
type Router struct {
	cfg        config.Config
	log        *slog.Logger
	pool       *workers.Pool
	checker    *workers.Checker
	scraper    *enginemetrics.Scraper // the workers' /metrics; nil unless --load-signal engine
	policy     policy.Policy
	prefill    policy.Policy // chooses prefill workers under --vllm-pd-disaggregation; nil otherwise
	metrics    *metrics.Metrics
	proxy      *proxy.Server
	probes     *http.Client         // health probes, /v1/models and probe requests
	store      *sharedStore         // nil unless --session-store redis
	keys       *clientkeys.Watcher  // nil unless --client-api-keys-file
	admission  *proxy.Admission     // nil unless admission control is configured
	tracer     *telemetry.Tracer    // nil unless traces are exported
	certs      *certReloader        // the listeners' certificate; nil unless --tls-cert-file
	workerCert *certReloader        // nil unless --worker-client-cert-file
	allowed    tenant.Allowed       // where workers may be (--worker-url-allow)
	fleet      *fleet.Fleet         // the one way workers join and leave the pool
	sources    []discovery.Source   // --service-discovery, --dns-discovery; run by Start
	accessLog  *telemetry.AccessLog // nil unless --access-log
	logFile    *os.File             // the access log's file; nil for stdout or none
	dashboard  *dashboard.Dashboard // the status page and its counters' history
	kvEvents   *kvevents.Set        // the workers' KV-cache event streams; nil unless --kv-events-endpoint
	kvBound    *kvevents.Bound      // the streams of publishers that dial the router; nil unless --kv-events-bind
}

// New builds a router from a validated configuration. Workers are registered by Start.
func New(cfg config.Config, log *slog.Logger) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pool := workers.NewPool(workers.Options{
		DPSize:                cfg.DPSize,
		RoleDPSize:            cfg.RoleDPSize(),
		CBFailureThreshold:    cfg.CBFailureThreshold,
		CBTimeout:             cfg.CBTimeout(),
		DisableCircuitBreaker: cfg.DisableCircuitBreaker,
		LoadSignal:            cfg.LoadSignal,
		LoadUnitTokens:        cfg.LoadUnitTokens,
		KVCapacityTokens:      cfg.KVCapacityTokens,
		EngineMaxAge:          workers.EngineMaxAge(cfg.WorkerMetricsInterval),
	})
	allowed, err := tenant.ParseAllowed(cfg.WorkerURLAllow)
	if err != nil {
		return nil, err
	}
	workerTLS, workerCert, err := newWorkerTLS(cfg, log)
	if err != nil {
		return nil, err
	}
	// Every call to a worker goes through this one dialer, with these timeouts.
	timeouts := cfg.UpstreamTimeouts()
	dialer := upstream.Dialer{Timeouts: timeouts, TLS: workerTLS, Allowed: allowed, APIKey: cfg.APIKey}
	r := &Router{cfg: cfg, log: log, pool: pool, probes: dialer.Client(), metrics: metrics.New(pool), workerCert: workerCert, allowed: allowed}
	if cfg.TLSCertFile != "" {
		if r.certs, err = newCertReloader(cfg.TLSCertFile, cfg.TLSKeyFile, "TLS certificate", log); err != nil {
			return nil, fmt.Errorf("--tls-cert-file, --tls-key-file: %w", err)
		}
	}
	var kvIndex *kvevents.Index // what the workers' engines report they hold; nil unless --kv-events-endpoint
	var tokens policy.Tokenizer // the policies' tokenizer, for the requests they match against kvIndex; nil without it
	if cfg.KVEventsOn() {
		kvIndex = kvevents.NewIndex(int64(cfg.KVEventsIndexSize))
		opts := tokenize.Options{CacheBytes: tokenCacheBytes, Dialer: dialer, Metrics: r.metrics, Log: log}
		if cfg.TokenizeURL != "" {
			opts.URL, _ = tenant.NormalizeURL(cfg.TokenizeURL) // validated with the configuration
		}
		tokens = tokenize.New(opts)
	}
	decodeCfg := cfg
	if cfg.PDDisaggregation {
		decodeCfg.Policy = cfg.PolicyFor(cfg.DecodePolicy)
	}
	p, store, err := newPolicy(decodeCfg, r.metrics, log, kvIndex, tokens)
	if err != nil {
		return nil, err
	}
	r.policy, r.store = p, store
	var pd *proxy.PDOptions
	if cfg.PDDisaggregation {
		// The prefill side's own policy: its own session map and prefix tree, in this process,
		// reporting nothing, so that its state never mixes with the decode side's.
		name := cfg.PolicyFor(cfg.PrefillPolicy)
		env := policy.Env{Log: log, SessionTTL: cfg.SessionTTL, MaxSessions: cfg.MaxSessions, LoadUnitTokens: cfg.LoadUnitTokens,
			KVIndex: kvIndex, Tokenizer: tokens}
		if r.prefill, err = policy.New(name, env, cfg.PolicyOptions[name]); err != nil {
			return nil, fmt.Errorf("--prefill-policy: %w", err)
		}
		pd = &proxy.PDOptions{Prefill: r.prefill, MinUncachedTokens: cfg.PDMinUncachedTokens}
	}
	if r.sources, err = newSources(cfg, log, processEnv); err != nil {
		return nil, err
	}
	r.checker = workers.NewChecker(pool, workers.HealthOptions{
		Endpoint:         cfg.HealthCheckEndpoint,
		Interval:         cfg.HealthCheckInterval(),
		Timeout:          timeouts.Probe,
		FailureThreshold: cfg.HealthFailureThreshold,
		SuccessThreshold: cfg.HealthSuccessThreshold,
		StallTimeout:     timeouts.Stall,
	}, r.probes, log)
	r.fleet = fleet.New(fleet.Options{Pool: pool, Allowed: allowed, Probe: r.checker.Check, KVEvents: workerEventEndpoints(cfg),
		Listeners: []fleet.Listener{fleetListener{r}}, Log: log})
	if cfg.LoadSignal == workers.SignalEngine {
		r.scraper = enginemetrics.New(pool, enginemetrics.Options{
			Interval: cfg.WorkerMetricsInterval,
			Timeout:  timeouts.Scrape,
			Dialer:   dialer,
		}, log)
	}
	if kvIndex != nil {
		r.kvEvents = kvevents.NewSet(kvIndex, log)
		if cfg.KVEventsBind != "" {
			if err := kvevents.Bindable(cfg.KVEventsBind); err != nil {
				return nil, fmt.Errorf("--kv-events-bind %s: %w", cfg.KVEventsBind, err)
			}
			r.kvBound = kvevents.NewBound(cfg.KVEventsBind, kvIndex, log)
			r.kvEvents.Bind(r.kvBound)
		}
		r.metrics.SetKVEvents(r.kvEvents)
	}
	if r.admission, err = r.newAdmission(cfg); err != nil {
		return nil, err
	}
	telemetry.SetSessionSalt(cfg.SessionHashSalt)
	if err := r.openAccessLog(cfg.AccessLog); err != nil {
		return nil, err
	}
	if r.tracer, err = telemetry.NewTracer(context.Background(), telemetry.TraceOptions{Endpoint: cfg.OTLPTracesEndpoint, SampleRatio: cfg.TraceSampleRatio}); err != nil {
		return nil, err
	}
	var keys proxy.ClientKeys
	if cfg.ClientAPIKeysFile != "" {
		opts := clientkeys.WatcherOptions{Logger: log, OnReload: r.keysReloaded}
		if r.admission != nil && r.admission.Controller != nil {
			opts.Check = checkPriorities(cfg.PriorityLevels)
		}
		w, err := clientkeys.NewWatcher(cfg.ClientAPIKeysFile, opts)
		if err != nil {
			return nil, fmt.Errorf("--client-api-keys-file: %w", err)
		}
		r.keys, keys = w, w
		r.keysReloaded(w.Current(), nil)
	}
	var storeHealth func(context.Context, bool) any
	if store != nil {
		storeHealth = func(ctx context.Context, detail bool) any {
			st := store.Status(ctx)
			if !detail {
				st.LastError, st.LastErrorTime = "", nil
			}
			return st
		}
	}
	r.dashboard = r.newDashboard(storeHealth)
	own := routerapi.New(routerapi.Options{
		Pool:                pool,
		Fleet:               r,
		Metrics:             r.metrics.Handler(),
		Upstream:            dialer,
		MaxPayloadSize:      cfg.MaxPayloadSize,
		AdminAPIKey:         cfg.AdminAPIKey,
		AdminURLCredentials: cfg.AdminWorkerURLCredentials,
		AdminOrigins:        cfg.AdminAllowedOrigins,
		OwnHosts:            ownHosts(cfg.Host),
		ClientKeys:          keys,
		SessionStore:        storeHealth,
		KVEvents:            r.kvEventsStatus(),
		Dashboard:           r.dashboard,
	})
	r.proxy = proxy.New(proxy.Options{
		MaxPayloadSize:      cfg.MaxPayloadSize,
		MaxRetries:          cfg.RetryMaxRetries,
		InitialBackoff:      cfg.RetryInitialBackoff(),
		MaxBackoff:          cfg.RetryMaxBackoff(),
		Own:                 own,
		ClientKeys:          keys,
		ForwardClientAuth:   cfg.ForwardClientAuth,
		Admission:           r.admission,
		CORSOrigins:         cfg.CORSAllowedOrigins,
		AccessLog:           r.accessLog,
		Tracer:              r.tracer,
		ClientHeaderTimeout: cfg.ClientHeaderTimeout(),
		ClientBodyTimeout:   cfg.ClientBodyTimeout(),
		KeepaliveTimeout:    cfg.KeepaliveTimeout(),
		ClientWriteTimeout:  cfg.ClientWriteTimeout(),
		MaxClientConns:      cfg.MaxClientConnections,
		ResponseSearch:      responsesearch.Options{Concurrency: cfg.ResponseSearchConcurrency, PerMinute: cfg.ResponseSearchPerMinute, TotalPerSecond: cfg.ResponseSearchTotalPerSecond},
		MaxBodyBytesTotal:   cfg.MaxBodyBytesTotal,

		MaxBodyBytesPerClient: cfg.MaxBodyBytesPerClient,
		Upstream: upstream.PoolOptions{
			Dialer:           dialer,
			MaxIdlePerWorker: maxIdlePerWorker,
		},
		PD: pd,

		StrictModels:       cfg.StrictModelMatching,
		RefuseUnknownPaths: cfg.RefuseUnknownPaths,
	}, pool, p, r.metrics, log)
	return r, nil
}

// maxIdlePerWorker bounds the routed path's idle connections to one worker. Each request in
// flight holds one connection (their number is bounded by --max-client-connections); of those
// that come back, up to maxIdlePerWorker stay open for reuse, each for at most
// upstream.Timeouts.Idle.
const maxIdlePerWorker = 256

// newPolicy builds the configured policy from the registry and, with --session-store redis, the
// shared session store it uses; kvIndex and tokens are the workers' KV-cache events and the
// tokenizer of the requests matched against them, nil without events.
func newPolicy(cfg config.Config, m *metrics.Metrics, log *slog.Logger, kvIndex *kvevents.Index, tokens policy.Tokenizer) (policy.Policy, *sharedStore, error) {
	var store *sharedStore
	env := policy.Env{Log: log, Reporter: m, SessionTTL: cfg.SessionTTL, MaxSessions: cfg.MaxSessions,
		LoadUnitTokens: cfg.LoadUnitTokens, KVIndex: kvIndex, Tokenizer: tokens}
	if cfg.SessionStore == "redis" {
		var err error
		if store, err = newSharedStore(cfg, m, log); err != nil {
			return nil, nil, err
		}
		env.Store = store
	}
	p, err := policy.New(cfg.Policy, env, cfg.PolicyOptions[cfg.Policy])
	if err != nil {
		return nil, nil, err
	}
	if st := p.State(); st != nil {
		m.SetPolicyState(st)
	}
	return p, store, nil
}

// sharedStore is the Redis session store behind its local fallback.
type sharedStore struct {
	*session.Fallback
	redis *session.Redis
}

// Broadcast is the Redis store's channel between the router's replicas (cache_aware shares its
// residency model through it).
func (s *sharedStore) Broadcast(name string) *session.Broadcast { return s.redis.Broadcast(name) }

// newSharedStore builds the Redis store with a local memory fallback. It does not contact Redis:
// a router whose Redis is down at startup routes with the fallback and starts using Redis as
// soon as it answers.
func newSharedStore(cfg config.Config, m *metrics.Metrics, log *slog.Logger) (*sharedStore, error) {
	opts := session.RedisOptions{
		URL:       cfg.RedisURL,
		KeyPrefix: cfg.RedisKeyPrefix,
		TTL:       cfg.SessionTTL,
		Timeout:   cfg.RedisTimeout,
	}
	if cfg.RedisCAFile != "" {
		cas, err := loadCAs(cfg.RedisCAFile)
		if err != nil {
			return nil, fmt.Errorf("--redis-ca-file: %w", err)
		}
		opts.RootCAs = cas
	}
	rs, err := session.NewRedis(opts)
	if err != nil {
		return nil, fmt.Errorf("--redis-url: %w", err)
	}
	local := session.NewMemory(session.MemoryOptions{TTL: cfg.SessionTTL, MaxEntries: cfg.MaxSessions})
	fb := session.NewFallback(rs, local, session.FallbackOptions{
		Backend: "redis",
		Observe: m.ObserveSessionStore,
		OnError: m.SessionStoreError,
		Log:     log,
	})
	return &sharedStore{Fallback: fb, redis: rs}, nil
}

// MetricsHandler serves only /metrics, for the separate metrics listener.
func (r *Router) MetricsHandler() http.Handler { return r.metrics.Handler() }

// Pool exposes the worker pool (read-only use: tests and the bench watch loads).
func (r *Router) Pool() *workers.Pool { return r.pool }

// Metrics exposes the router's collectors.
func (r *Router) Metrics() *metrics.Metrics { return r.metrics }

// AddWorker joins a worker URL as the admin API does (colocated) and waits for its first probe;
// a worker that does not answer stays registered as unhealthy. It is for in-process callers (the
// bench, tests).
func (r *Router) AddWorker(ctx context.Context, raw string) error {
	u, err := tenant.ParseURL(raw)
	if err != nil {
		return err
	}
	j, err := r.fleet.Join(ctx, fleet.Admin, u, workers.RoleColocated, kvevents.WorkerEndpoints{})
	if err != nil {
		return err
	}
	select {
	case <-j.Probed:
	case <-ctx.Done():
	}
	return nil
}

// RemoveWorker takes a worker URL out of the fleet, whichever sources joined it, as the admin API
// does.
func (r *Router) RemoveWorker(raw string) error {
	u, err := tenant.ParseURL(raw)
	if err != nil {
		return err
	}
	return r.fleet.Remove(u)
}

// Join is the fleet's Join, for the admin API.
func (r *Router) Join(ctx context.Context, src fleet.Source, u tenant.URL, role workers.Role, ev kvevents.WorkerEndpoints) (fleet.Joined, error) {
	return r.fleet.Join(ctx, src, u, role, ev)
}

// Remove is the fleet's Remove, for the admin API.
func (r *Router) Remove(u tenant.URL) error { return r.fleet.Remove(u) }

// fleetListener tells the policy, the metrics and the proxy of every worker that joins or
// leaves the fleet. A joined worker's tenants get their counters at 0, so that per-worker rates
// have a series before the first request; a worker that left is forgotten by all three (the
// policy's state, the metric series, the idle connections).
type fleetListener struct{ r *Router }

func (l fleetListener) WorkerJoined(u tenant.URL, tenants []*workers.Worker) {
	l.r.policy.WorkerAdded(u.String())
	if l.r.prefill != nil {
		l.r.prefill.WorkerAdded(u.String())
	}
	labels := l.r.policy.Labels()
	if len(labels) == 0 {
		labels = []string{l.r.policy.Name()} // a policy without labels gives its name
	}
	for _, w := range tenants {
		l.r.metrics.WorkerAdded(l.r.policy.Name(), labels, w.Name())
	}
}

func (l fleetListener) WorkerLeft(u tenant.URL, tenants []*workers.Worker) {
	l.r.policy.WorkerRemoved(u.String())
	if l.r.prefill != nil {
		l.r.prefill.WorkerRemoved(u.String())
	}
	for _, w := range tenants {
		l.r.metrics.ForgetWorker(w.Name())
	}
	l.r.proxy.WorkerRemoved(u.String())
}

// CheckWorker probes one registered worker URL now: health and model list.
func (r *Router) CheckWorker(ctx context.Context, url string) { r.checker.Check(ctx, url) }

// ReloadClientKeys reads the client keys file again now (SIGHUP); a file that does not load
// leaves the keys in use unchanged.
func (r *Router) ReloadClientKeys() error {
	if r.keys == nil {
		return nil
	}
	return r.keys.Reload()
}

// CheckHealth runs one round of health checks now (the background loop does so every interval).
func (r *Router) CheckHealth(ctx context.Context) { r.checker.CheckAll(ctx) }

// Start registers the configured workers in the order given, probes them concurrently, and
// starts the background loops, discovery among them, which stop when ctx ends.
func (r *Router) Start(ctx context.Context) {
	var probes []<-chan struct{}
	for _, w := range r.cfg.StaticWorkers() {
		u, err := tenant.ParseURL(w.URL)
		var j fleet.Joined
		if err == nil {
			j, err = r.fleet.Join(ctx, fleet.Static, u, w.Role, kvevents.WorkerEndpoints{}) // --kv-events-worker-endpoints: the fleet's own
		}
		if err != nil {
			r.log.Warn("worker not added", "worker", tenant.Redact(w.URL), "role", w.Role, "error", err)
			continue
		}
		probes = append(probes, j.Probed)
	}
	for _, p := range probes {
		<-p
	}
	r.startDiscovery(ctx, r.sources...)
	if r.store != nil {
		st := r.store.Status(ctx) // one bounded ping; Redis being down does not stop the start
		r.log.Info("session store", "backend", st.Backend, "reachable", st.Reachable)
	}
	go r.checker.Run(ctx)
	if r.scraper != nil {
		go r.scraper.Run(ctx) // stops, its connections closed, when ctx ends
	}
	if r.keys != nil {
		go func() { _ = r.keys.Run(ctx) }()
	}
	if r.kvEvents != nil {
		go r.syncKVEvents(ctx)
	}
	go r.wakeAdmission(ctx)
	go r.policy.Run(ctx)
	if r.prefill != nil {
		go r.prefill.Run(ctx)
	}
}

// Serve answers on ln (and on metricsLn, if not nil) until ctx ends, then stops accepting, lets
// in-flight requests finish for the shutdown grace period, answers those still waiting for
// admission 503 when it ends, and returns nil on a clean drain: every request answered, none
// cut. Requests still with a worker queueAnswerWait after the grace are cut, and that is an error.
// With a certificate (--tls-cert-file) both speak TLS only.
func (r *Router) Serve(ctx context.Context, ln, metricsLn net.Listener) error {
	srv := r.proxy.HTTPServer()
	errc := make(chan error, 2)
	traffic := retryAccept(ln, r.log)
	if n := r.cfg.MaxConnectionsPerClient; n > 0 {
		traffic = capPerClient(traffic, n, r.certs != nil) // under TLS: a refusal costs no handshake
	}
	if r.certs != nil {
		// Over the accept retries; the connection cap (fasthttp's Concurrency) closes a TLS
		// connection over it without a handshake. The handshake must end within the client
		// header timeout of the accept.
		traffic = tlsListener(traffic, r.certs.serverConfig(), r.cfg.ClientHeaderTimeout())
	}
	go func() { errc <- srv.Serve(proxy.RecordRequestStarts(traffic)) }()
	go r.dashboard.Run(ctx)
	var msrv *http.Server
	if metricsLn != nil {
		// The metrics listener has limits of its own, so that a flood of connections to the
		// traffic port, or to this one, cannot take scraping down with it.
		msrv = &http.Server{Handler: r.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second,
			ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second, IdleTimeout: 75 * time.Second,
			ErrorLog: slog.NewLogLogger(r.log.Handler(), slog.LevelDebug)}
		mln := capListener(retryAccept(metricsLn, r.log), maxMetricsConns)
		if r.certs != nil {
			// net/http does the handshake itself, bounded by ReadHeaderTimeout. The cap stays
			// under TLS, so refusing a connection over it costs no handshake.
			mln = tls.NewListener(mln, r.certs.serverConfig())
		}
		go func() { errc <- msrv.Serve(mln) }()
	}
	stopAll := func() {
		_ = srv.Shutdown()
		if msrv != nil {
			_ = msrv.Close()
		}
	}
	select {
	case err := <-errc:
		stopAll()
		return err
	case <-ctx.Done():
	}
	r.log.Info("shutting down: draining in-flight requests", "grace", r.cfg.ShutdownGrace())
	// When the grace ends, the requests still waiting for admission are answered 503; the drain
	// goes on for queueAnswerWait more, so that those answers are written and requests that
	// finish meanwhile count as drained.
	graceEnd := time.AfterFunc(r.cfg.ShutdownGrace(), func() {
		r.log.Warn("shutdown grace ended: answering queued requests 503")
		r.proxy.EndQueue()
	})
	defer graceEnd.Stop()
	drainCtx, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownGrace()+queueAnswerWait)
	defer cancel()
	firstErr := srv.ShutdownWithContext(drainCtx)
	if msrv != nil {
		if err := msrv.Shutdown(drainCtx); err != nil && firstErr == nil {
			firstErr = err
		}
		_ = msrv.Close()
	}
	r.proxy.CloseIdleConnections()
	r.closeAccessLog()
	r.flushTraces()
	r.probes.CloseIdleConnections()
	if r.store != nil {
		_ = r.store.redis.Close()
	}
	if errors.Is(firstErr, context.DeadlineExceeded) {
		return errors.New("shutdown grace period ended with requests still in flight")
	}
	return firstErr
}

// openAccessLog starts the access log at dest: a file, appended to, or stdout; "" for none.
func (r *Router) openAccessLog(dest string) error {
	var w io.Writer
	switch dest {
	case "":
		return nil
	case "stdout":
		w = os.Stdout
	default:
		f, err := os.OpenFile(dest, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
		if err != nil {
			return fmt.Errorf("--access-log: %w", err)
		}
		r.logFile, w = f, f
	}
	r.accessLog = telemetry.NewAccessLog(w, r.metrics.AccessLogDropped.Inc)
	return nil
}

// closeAccessLog writes what the access log still holds, once the requests have drained.
func (r *Router) closeAccessLog() {
	if r.accessLog == nil {
		return
	}
	r.accessLog.Close()
	if r.logFile != nil {
		_ = r.logFile.Close()
	}
}

// flushTraces exports the spans still queued, for at most a few seconds, once the requests have
// drained.
func (r *Router) flushTraces() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.tracer.Shutdown(ctx); err != nil {
		r.log.Warn("traces not all exported at shutdown", "error", err)
	}
}

// reloadOnHangup reloads the client keys file and the TLS certificates on every SIGHUP until ctx
// ends.
func (r *Router) reloadOnHangup(ctx context.Context) {
	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hup:
			if err := r.ReloadClientKeys(); err == nil && r.keys != nil {
				r.log.Info("client keys reloaded", "keys", r.keys.Current().Len())
			}
			_ = r.ReloadCertificates() // each certificate logs its own outcome
		}
	}
}

// queueAnswerWait is how long the drain lasts past the shutdown grace, for the answers to the
// requests that were still queued to be written.
const queueAnswerWait = 2 * time.Second

// maxMetricsConns caps the metrics listener's open connections; a scraper needs a handful.
const maxMetricsConns = 64

// Run listens on the configured addresses, registers the workers and serves until ctx ends.
func Run(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	r, err := New(cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return listenError(err, "--port", "--host", "")
	}
	var metricsLn net.Listener
	if cfg.PrometheusPort != 0 {
		if metricsLn, err = net.Listen("tcp", net.JoinHostPort(cfg.PrometheusHost, strconv.Itoa(cfg.PrometheusPort))); err != nil {
			ln.Close()
			return listenError(err, "--prometheus-port", "--prometheus-host", "; 0 disables the metrics listener")
		}
	}
	log.Info("cacheroute listening", "addr", ln.Addr().String(), "tls", cfg.TLSCertFile != "", "policy", cfg.Policy, "workers", len(cfg.WorkerURLs),
		"status_page", statusPageURL(ln.Addr(), cfg.TLSCertFile != ""))
	r.Start(ctx)
	go r.reloadOnHangup(ctx)
	return r.Serve(ctx, ln, metricsLn)
}

// statusPageURL is where a browser on this host opens the status page of a router listening on
// addr: localhost for a wildcard address (the page answers loopback callers unless an admin key
// is set).
func statusPageURL(addr net.Addr, tls bool) string {
	host, port, err := net.SplitHostPort(addr.String())
	if err != nil {
		return ""
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "localhost"
	}
	scheme := "http"
	if tls {
		scheme = "https"
	}
	return scheme + "://" + net.JoinHostPort(host, port) + routerapi.DashboardPath
}

// listenError names the flags behind a listener that could not be opened, so that a user who never
// chose the address (a second router on one host meets the default --prometheus-port) knows which
// flag to change: the port flag when the port is taken or refused, both otherwise.
func listenError(err error, portFlag, hostFlag, note string) error {
	flags := hostFlag + ", " + portFlag
	if errors.Is(err, syscall.EADDRINUSE) || errors.Is(err, syscall.EACCES) {
		flags = portFlag
	}
	return fmt.Errorf("%w (%s%s)", err, flags, note)
}

// newDashboard builds the status page over the router's pool, metrics, policy state, session
// store and admission queue.
func (r *Router) newDashboard(store func(context.Context, bool) any) *dashboard.Dashboard {
	opts := dashboard.Options{Pool: r.pool, Metrics: r.metrics, Policy: r.cfg.Policy, SessionStore: store}
	if st := r.policy.State(); st != nil {
		opts.State = st
	}
	if r.admission != nil && r.admission.Controller != nil {
		c := r.admission.Controller
		opts.Queue = func() (int, int) { return c.InFlight(), c.Queued() }
	}
	opts.KVEvents = r.kvEventsStatus()
	return dashboard.New(opts)
}

// kvEventsStatus reports the event streams, for the status page and the worker lists; nil without
// subscriptions.
func (r *Router) kvEventsStatus() func() []kvevents.Status {
	if r.kvEvents == nil {
		return nil
	}
	return r.kvEvents.Status
}

// ownHosts are the names of this host that an admin request's Host may carry besides localhost and
// the loopback addresses: the listen address, unless it is a wildcard, and the machine's name.
func ownHosts(listen string) []string {
	var hosts []string
	if ip := net.ParseIP(listen); listen != "" && (ip == nil || !ip.IsUnspecified()) {
		hosts = append(hosts, listen)
	}
	if name, err := os.Hostname(); err == nil && name != "" {
		hosts = append(hosts, name)
	}
	return hosts
}
