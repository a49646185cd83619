package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/discovery"
	"github.com/cacheroute/cacheroute/internal/kubeapi"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// discoveryEnv is what building the discovery sources takes from outside the process; tests
// give a fake cluster and an in-process resolver instead.
type discoveryEnv struct {
	kubeClient func(kubeconfig string) (*kubeapi.Client, error)
	namespace  func() string        // the namespace watched when --service-discovery-namespace is empty
	lookup     discovery.LookupFunc // nil: the system resolver
}

var processEnv = discoveryEnv{kubeClient: discovery.NewClient, namespace: discovery.DefaultNamespace}

// newSources builds the sources the configuration asks for: none, Kubernetes pods, DNS, or both.
func newSources(cfg config.Config, log *slog.Logger, env discoveryEnv) ([]discovery.Source, error) {
	var out []discovery.Source
	if cfg.ServiceDiscovery {
		client, err := env.kubeClient(cfg.Kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("--service-discovery: %w", err)
		}
		ns := cfg.ServiceDiscoveryNamespace
		if ns == "" {
			ns = env.namespace()
		}
		src, err := discovery.NewKubernetes(discovery.KubernetesOptions{
			Client: client, Namespace: ns, Selector: cfg.SelectorString(), Port: cfg.ServiceDiscoveryPort, Log: log,
		})
		if err != nil {
			return nil, fmt.Errorf("--service-discovery: %w", err)
		}
		out = append(out, src)
	}
	if cfg.DNSDiscovery != "" {
		name, port, err := cfg.DNSTarget()
		if err != nil {
			return nil, fmt.Errorf("--dns-discovery: %w", err)
		}
		src, err := discovery.NewDNS(discovery.DNSOptions{Name: name, Port: port, Refresh: cfg.DNSRefresh(), Lookup: env.lookup, Log: log})
		if err != nil {
			return nil, fmt.Errorf("--dns-discovery: %w", err)
		}
		out = append(out, src)
	}
	return out, nil
}

// sourceRestartDelay is the pause before a source whose Run failed is run again (a variable for
// tests).
var sourceRestartDelay = 5 * time.Second

// startDiscovery runs each source until ctx ends and applies every set it reports to the pool.
func (r *Router) startDiscovery(ctx context.Context, sources ...discovery.Source) *reconciler {
	rc := &reconciler{r: r, ctx: ctx, sets: map[string][]discovery.Endpoint{}, owned: map[string]*member{}, shadowed: map[string]bool{}}
	for _, src := range sources {
		r.log.Info("discovery started", "source", src.Name())
		go func() {
			for {
				err := src.Run(ctx, func(set []discovery.Endpoint) { rc.apply(src.Name(), set) })
				if ctx.Err() != nil {
					return
				}
				r.log.Error("discovery stopped; starting it again", "source", src.Name(), "error", err, "in", sourceRestartDelay)
				select {
				case <-ctx.Done():
					return
				case <-time.After(sourceRestartDelay):
				}
			}
		}()
	}
	return rc
}

// reconciler keeps the pool in step with the sets the sources report. It manages only the
// workers it registered itself: a URL already registered by --worker-urls or the admin API is
// left alone, and it is never removed by discovery.
//
//   - join: a ready endpoint not in the pool is registered (unhealthy, so it takes nothing yet)
//     and probed at once; the probe's verdict lets it in.
//   - drain: an endpoint reported not ready stays registered but takes no new request; its
//     in-flight requests finish. Nothing about it is forgotten eagerly, for it may be ready
//     again soon: the policy treats it as it treats an unhealthy worker, so each of its
//     sessions re-places at its next turn. When it is ready again it is probed, then takes
//     requests again.
//   - leave: an endpoint no longer reported is removed like an admin removal: pool, prefix
//     tree, sessions, metric series, idle connections. Requests in flight on it finish; its
//     sessions re-place at their next turn. An address change is a leave and a join.
type reconciler struct {
	r   *Router
	ctx context.Context // the probes'

	mu       sync.Mutex
	sets     map[string][]discovery.Endpoint // the last set of each source
	owned    map[string]*member              // URL → a worker discovery registered
	shadowed map[string]bool                 // URLs wanted but registered otherwise (logged once)
}

type member struct {
	name     string // where it came from, for logs
	draining bool   // wanted state; the workers' flag follows once an undrain probe is done
	gen      int    // changes with every drain and undrain, so a late probe knows it is stale
}

// apply records source's set and brings the pool in line with all the sets together: a URL
// that any source reports is wanted, and ready when any source says so.
func (rc *reconciler) apply(source string, set []discovery.Endpoint) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.sets[source] = set
	want := map[string]discovery.Endpoint{}
	for _, s := range slices.Sorted(maps.Keys(rc.sets)) {
		for _, e := range rc.sets[s] {
			url, err := tenant.NormalizeURL(e.URL)
			if err != nil {
				rc.r.log.Warn("discovery: endpoint ignored", "source", s, "endpoint", e.Name, "error", err)
				continue
			}
			if prev, ok := want[url]; ok {
				e.Ready = e.Ready || prev.Ready
			}
			want[url] = e
		}
	}
	for _, url := range slices.Sorted(maps.Keys(rc.owned)) {
		if _, ok := want[url]; !ok {
			rc.leave(url)
		}
	}
	for url := range rc.shadowed {
		if _, ok := want[url]; !ok {
			delete(rc.shadowed, url)
		}
	}
	for _, url := range slices.Sorted(maps.Keys(want)) {
		e := want[url]
		m := rc.owned[url]
		if m != nil && len(rc.r.pool.Get(url)) == 0 {
			delete(rc.owned, url) // removed through the admin API meanwhile: join again
			m = nil
		}
		switch {
		case m == nil && e.Ready:
			rc.join(url, e.Name)
		case m == nil:
			// Never ready while discovered: nothing to do until it is.
		case !e.Ready && !m.draining:
			m.draining = true
			m.gen++
			setDraining(rc.r.pool.Get(url), true)
			rc.r.log.Info("worker draining", "worker", tenant.Redact(url), "endpoint", m.name)
		case e.Ready && m.draining:
			m.draining = false
			m.gen++
			rc.undrain(url, m, m.gen)
		}
	}
}

// join registers url and probes it in the background; until the probe passes it takes nothing.
func (rc *reconciler) join(url, name string) {
	err := rc.r.allowed.CheckURL(url)
	if err == nil {
		_, err = rc.r.addToPool(url)
	}
	switch {
	case errors.Is(err, workers.ErrExists):
		if !rc.shadowed[url] {
			rc.shadowed[url] = true
			rc.r.log.Info("discovery: worker already registered by flag or admin API; left to them", "worker", tenant.Redact(url), "endpoint", name)
		}
		return
	case err != nil:
		if !rc.shadowed[url] {
			rc.shadowed[url] = true
			rc.r.log.Warn("discovery: worker not added", "worker", tenant.Redact(url), "endpoint", name, "error", err)
		}
		return
	}
	rc.owned[url] = &member{name: name}
	go func() {
		rc.r.checker.Check(rc.ctx, url)
		if ts := rc.r.pool.Get(url); len(ts) > 0 {
			rc.r.log.Info("worker joined", "worker", tenant.Redact(url), "endpoint", name, "healthy", ts[0].Healthy())
		}
	}()
}

// undrain probes url and lets it take requests again, unless it was drained or removed meanwhile.
func (rc *reconciler) undrain(url string, m *member, gen int) {
	go func() {
		rc.r.checker.Check(rc.ctx, url)
		rc.mu.Lock()
		defer rc.mu.Unlock()
		if rc.owned[url] != m || m.gen != gen {
			return
		}
		ts := rc.r.pool.Get(url)
		setDraining(ts, false)
		if len(ts) > 0 {
			rc.r.log.Info("worker ready again", "worker", tenant.Redact(url), "endpoint", m.name, "healthy", ts[0].Healthy())
		}
	}()
}

// leave removes url with everything that names it.
func (rc *reconciler) leave(url string) {
	m := rc.owned[url]
	delete(rc.owned, url)
	if err := rc.r.RemoveWorker(url); err != nil && !errors.Is(err, workers.ErrNotFound) {
		rc.r.log.Warn("discovery: worker not removed", "worker", tenant.Redact(url), "endpoint", m.name, "error", err)
	}
}

func setDraining(ts []*workers.Worker, draining bool) {
	for _, w := range ts {
		w.SetDraining(draining)
	}
}

// Discovered lists the worker URLs that discovery registered, each with whether it is draining.
func (rc *reconciler) Discovered() map[string]bool {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	out := make(map[string]bool, len(rc.owned))
	for url, m := range rc.owned {
		out[url] = m.draining
	}
	return out
}
