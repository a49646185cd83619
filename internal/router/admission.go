package router

import (
	"context"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// newAdmission builds the proxy's admission control from the configuration, or nil when none is
// configured. keys, when set, names the tenants the rate limits apply to.
func (r *Router) newAdmission(cfg config.Config) (*proxy.Admission, error) {
	if !cfg.Admission() {
		return nil, nil
	}
	a := &proxy.Admission{PriorityHeader: cfg.PriorityHeader}
	if cfg.MaxConcurrentRequests > 0 || cfg.MaxInflightPerWorker > 0 {
		opts := admission.Options{
			MaxInFlight:  cfg.MaxConcurrentRequests,
			Reserve:      cfg.PriorityReserve,
			QueueSize:    cfg.QueueSize,
			QueueTimeout: cfg.QueueTimeout(),
			Priorities:   cfg.PriorityLevels,
			Reporter:     r.metrics.AdmissionReporter(),
		}
		if slices.Contains(cfg.PriorityLevels, "default") {
			opts.DefaultPriority = "default"
		}
		if limit := cfg.MaxInflightPerWorker; limit > 0 {
			opts.Ready = func(model string, admitted int) bool { return admitted < limit*servingWorkers(r.pool, model) }
		}
		c, err := admission.New(opts)
		if err != nil {
			return nil, err
		}
		a.Controller = c
	}
	if cfg.TenantRPM > 0 || cfg.TenantTPM > 0 {
		rl := &tenantLimits{rate: admission.Rate{RequestsPerMinute: cfg.TenantRPM, TokensPerMinute: cfg.TenantTPM}}
		if r.store != nil { // --session-store redis: the replicas share the buckets
			rl.shared = r.store.redis
			rl.sharedOpts = session.RedisLimiterOptions{
				Observe: r.metrics.ObserveSessionStore,
				OnError: r.metrics.SessionStoreError,
				Log:     r.log,
			}
		}
		if err := rl.rebuild([]string{clientkeys.DefaultTenant}); err != nil {
			return nil, err
		}
		a.Limiter = rl
	}
	return a, nil
}

// servingWorkers counts the available worker tenants serving model: with the per-worker limit,
// they bound the requests of the model admitted at once. The requests kept under no model (they
// name none on a fleet of several, or a name no worker lists) may go to any available worker.
func servingWorkers(pool *workers.Pool, model string) int {
	n := 0
	for _, w := range pool.All() {
		if w.Available() && (model == "" || w.Serves(model)) {
			n++
		}
	}
	return n
}

// tenantLimits gives every tenant the same rates. It is rebuilt for the tenants of the client
// keys when they are reloaded, so that tenants added to the keys file are limited too. With a
// shared store the buckets are in Redis, where a rebuild leaves them as they are; the buckets of
// this process, the whole limit while Redis fails, are rebuilt full.
type tenantLimits struct {
	rate       admission.Rate
	shared     *session.Redis // nil: the buckets are this process's own
	sharedOpts session.RedisLimiterOptions
	current    atomic.Pointer[limiter]
}

// limiter lets an atomic.Pointer hold either kind of admission.Limiter.
type limiter struct{ admission.Limiter }

func (t *tenantLimits) rebuild(tenants []string) error {
	rates := make(map[string]admission.Rate, len(tenants)+1)
	rates[clientkeys.DefaultTenant] = t.rate
	for _, name := range tenants {
		rates[name] = t.rate
	}
	local, err := admission.NewMemoryLimiter(rates, time.Now)
	if err != nil {
		return err
	}
	if t.shared == nil {
		t.current.Store(&limiter{local})
		return nil
	}
	opts := t.sharedOpts
	opts.Rates, opts.Fallback = rates, local
	l, err := session.NewRedisLimiter(t.shared, opts)
	if err != nil {
		return err
	}
	t.current.Store(&limiter{l})
	return nil
}

func (t *tenantLimits) Check(ctx context.Context, tenant string, tokens int) admission.Decision {
	return t.current.Load().Check(ctx, tenant, tokens)
}

// keysReloaded keeps admission in step with a reloaded client keys file: its tenants get rate
// limits.
func (r *Router) keysReloaded(set *clientkeys.Set, err error) {
	if err != nil || r.admission == nil {
		return
	}
	if rl, ok := r.admission.Limiter.(*tenantLimits); ok {
		if err := rl.rebuild(set.Tenants()); err != nil {
			r.log.Warn("rate limits not rebuilt for the reloaded client keys", "error", err)
		}
	}
}

// checkPriorities refuses a client keys file that names a priority level admission does not
// know, so that a bad file fails to load rather than those clients' requests.
func checkPriorities(levels []string) func(*clientkeys.Set) error {
	return func(set *clientkeys.Set) error {
		for _, p := range set.Priorities() {
			if !slices.Contains(levels, p) {
				return fmt.Errorf("priority=%s is not one of --priority-levels %v", p, levels)
			}
		}
		return nil
	}
}

// wakeAdmission offers the admission queue again every interval until ctx ends: a worker that
// becomes healthy or closes a failed attempt gains room without a request ending.
func (r *Router) wakeAdmission(ctx context.Context) {
	if r.admission == nil || r.admission.Controller == nil {
		return
	}
	t := time.NewTicker(admissionWakeInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			r.admission.Controller.Wake()
		}
	}
}

const admissionWakeInterval = 100 * time.Millisecond
