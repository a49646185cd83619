// Package router assembles one cacheroute router from its configuration: the worker pool and its
// health checker, the policy, the metrics and the proxy, and runs it with a graceful shutdown.
package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Router is one running router instance.
type Router struct {
	cfg       config.Config
	log       *slog.Logger
	pool      *workers.Pool
	checker   *workers.Checker
	policy    policy.Policy
	metrics   *metrics.Metrics
	proxy     *proxy.Server
	transport *http.Transport
	store     *sharedStore // nil unless --session-store redis
}

// New builds a router from a validated configuration. Workers are registered by Start.
func New(cfg config.Config, log *slog.Logger) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	pool := workers.NewPool(workers.Options{
		DPSize:                cfg.DPSize,
		CBFailureThreshold:    cfg.CBFailureThreshold,
		CBTimeout:             cfg.CBTimeout(),
		DisableCircuitBreaker: cfg.DisableCircuitBreaker,
	})
	transport := &http.Transport{
		Proxy:                 nil, // workers are reached directly, never through an environment proxy
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:          1024,
		MaxIdleConnsPerHost:   256,
		IdleConnTimeout:       90 * time.Second,
		DisableCompression:    true, // pass bodies through exactly as the worker encoded them
		ExpectContinueTimeout: 0,
	}
	r := &Router{cfg: cfg, log: log, pool: pool, transport: transport, metrics: metrics.New(pool)}
	p, store, err := newPolicy(cfg, r.metrics, log)
	if err != nil {
		return nil, err
	}
	r.policy, r.store = p, store
	r.checker = workers.NewChecker(pool, workers.HealthOptions{
		Endpoint:         cfg.HealthCheckEndpoint,
		Interval:         cfg.HealthCheckInterval(),
		Timeout:          cfg.HealthCheckTimeout(),
		FailureThreshold: cfg.HealthFailureThreshold,
		SuccessThreshold: cfg.HealthSuccessThreshold,
		APIKey:           cfg.APIKey,
	}, &http.Client{Transport: transport}, log)
	var storeHealth func(context.Context) any
	if store != nil {
		storeHealth = func(ctx context.Context) any { return store.Status(ctx) }
	}
	r.proxy = proxy.New(proxy.Options{
		MaxPayloadSize: cfg.MaxPayloadSize,
		RequestTimeout: cfg.RequestTimeout(),
		MaxRetries:     cfg.RetryMaxRetries,
		InitialBackoff: cfg.RetryInitialBackoff(),
		MaxBackoff:     cfg.RetryMaxBackoff(),
		APIKey:         cfg.APIKey,
		AdminAPIKey:    cfg.AdminAPIKey,
		SessionStore:   storeHealth,
	}, pool, r, p, r.metrics, transport, log)
	return r, nil
}

// newPolicy builds the configured policy and, for cache_aware with --session-store redis, the
// shared session store it uses.
func newPolicy(cfg config.Config, m *metrics.Metrics, log *slog.Logger) (policy.Policy, *sharedStore, error) {
	if cfg.Policy != "cache_aware" {
		p, err := policy.New(cfg.Policy)
		return p, nil, err
	}
	var store *sharedStore
	opts := cacheaware.Options{
		CacheThreshold:      cfg.CacheThreshold,
		BalanceAbsThreshold: cfg.BalanceAbsThreshold,
		BalanceRelThreshold: cfg.BalanceRelThreshold,
		MaxTreeSize:         cfg.MaxTreeSize,
		EvictionInterval:    cfg.EvictionInterval(),
		SessionTTL:          cfg.SessionTTL,
		MaxSessions:         cfg.MaxSessions,
	}
	if cfg.SessionStore == "redis" {
		var err error
		if store, err = newSharedStore(cfg, m, log); err != nil {
			return nil, nil, err
		}
		opts.Store = store
	}
	return cacheaware.New(opts, m, log), store, nil
}

// sharedStore is the Redis session store behind its local fallback.
type sharedStore struct {
	*session.Fallback
	redis *session.Redis
}

// newSharedStore builds the Redis store with a local memory fallback. It does not contact Redis:
// a router whose Redis is down at startup routes with the fallback and starts using Redis as
// soon as it answers.
func newSharedStore(cfg config.Config, m *metrics.Metrics, log *slog.Logger) (*sharedStore, error) {
	rs, err := session.NewRedis(session.RedisOptions{
		URL:       cfg.RedisURL,
		KeyPrefix: cfg.RedisKeyPrefix,
		TTL:       cfg.SessionTTL,
		Timeout:   cfg.RedisTimeout,
	})
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

// Handler is the router's HTTP handler (routed endpoints, health, models, metrics, admin).
func (r *Router) Handler() http.Handler { return r.proxy }

// MetricsHandler serves only /metrics, for the separate metrics listener.
func (r *Router) MetricsHandler() http.Handler { return r.metrics.Handler() }

// Pool exposes the worker pool (read-only use: tests and the bench watch loads).
func (r *Router) Pool() *workers.Pool { return r.pool }

// Metrics exposes the router's collectors.
func (r *Router) Metrics() *metrics.Metrics { return r.metrics }

// AddWorker registers a worker URL and probes it at once; a worker that does not answer stays
// registered as unhealthy.
func (r *Router) AddWorker(ctx context.Context, url string) error {
	url = workers.TrimURL(url)
	if err := config.ValidateWorkerURL(url); err != nil {
		return err
	}
	if _, err := r.pool.Add(url); err != nil {
		return err
	}
	r.checker.Check(ctx, url)
	r.log.Info("worker added", "worker", url, "healthy", r.pool.Get(url)[0].Healthy())
	return nil
}

// RemoveWorker unregisters every tenant of url and forgets all state that names them.
func (r *Router) RemoveWorker(url string) error {
	removed, err := r.pool.Remove(workers.TrimURL(url))
	if err != nil {
		return err
	}
	if l, ok := r.policy.(policy.WorkerRemovalListener); ok {
		l.WorkerRemoved(url)
	}
	for _, w := range removed {
		r.metrics.ForgetWorker(w.Tenant())
	}
	r.log.Info("worker removed", "worker", url)
	return nil
}

// CheckHealth runs one round of health checks now (the background loop does so every interval).
func (r *Router) CheckHealth(ctx context.Context) { r.checker.CheckAll(ctx) }

// Start registers the configured workers in the order given, probes them concurrently, and
// starts the background loops, which stop when ctx ends.
func (r *Router) Start(ctx context.Context) {
	var wg sync.WaitGroup
	for _, url := range r.cfg.WorkerURLs {
		url = workers.TrimURL(url)
		if _, err := r.pool.Add(url); err != nil {
			r.log.Warn("worker not added", "worker", url, "error", err)
			continue
		}
		wg.Go(func() { r.checker.Check(ctx, url) })
	}
	wg.Wait()
	if r.store != nil {
		st := r.store.Status(ctx) // one bounded ping; Redis being down does not stop the start
		r.log.Info("session store", "backend", st.Backend, "reachable", st.Reachable)
	}
	go r.checker.Run(ctx)
	if sweeper, ok := r.policy.(interface{ Run(context.Context) }); ok {
		go sweeper.Run(ctx)
	}
}

// Serve answers on ln (and on metricsLn, if not nil) until ctx ends, then stops accepting, lets
// in-flight requests finish for the shutdown grace period, and returns nil on a clean drain.
func (r *Router) Serve(ctx context.Context, ln, metricsLn net.Listener) error {
	srv := &http.Server{Handler: r.proxy, ReadHeaderTimeout: 30 * time.Second, ErrorLog: slog.NewLogLogger(r.log.Handler(), slog.LevelDebug)}
	servers := []*http.Server{srv}
	errc := make(chan error, 2)
	go func() { errc <- srv.Serve(ln) }()
	if metricsLn != nil {
		msrv := &http.Server{Handler: r.MetricsHandler(), ReadHeaderTimeout: 10 * time.Second}
		servers = append(servers, msrv)
		go func() { errc <- msrv.Serve(metricsLn) }()
	}
	select {
	case err := <-errc:
		for _, s := range servers {
			_ = s.Close()
		}
		return err
	case <-ctx.Done():
	}
	r.log.Info("shutting down: draining in-flight requests", "grace", r.cfg.ShutdownGrace())
	drainCtx, cancel := context.WithTimeout(context.Background(), r.cfg.ShutdownGrace())
	defer cancel()
	var firstErr error
	for _, s := range servers {
		if err := s.Shutdown(drainCtx); err != nil && firstErr == nil {
			firstErr = err
			_ = s.Close()
		}
	}
	r.transport.CloseIdleConnections()
	if r.store != nil {
		_ = r.store.redis.Close()
	}
	if errors.Is(firstErr, context.DeadlineExceeded) {
		return errors.New("shutdown grace period ended with requests still in flight")
	}
	return firstErr
}

// Run listens on the configured addresses, registers the workers and serves until ctx ends.
func Run(ctx context.Context, cfg config.Config, log *slog.Logger) error {
	r, err := New(cfg, log)
	if err != nil {
		return err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(cfg.Host, strconv.Itoa(cfg.Port)))
	if err != nil {
		return err
	}
	var metricsLn net.Listener
	if cfg.PrometheusPort != 0 {
		if metricsLn, err = net.Listen("tcp", net.JoinHostPort(cfg.PrometheusHost, strconv.Itoa(cfg.PrometheusPort))); err != nil {
			ln.Close()
			return err
		}
	}
	log.Info("cacheroute listening", "addr", ln.Addr().String(), "policy", cfg.Policy, "workers", len(cfg.WorkerURLs))
	r.Start(ctx)
	return r.Serve(ctx, ln, metricsLn)
}
