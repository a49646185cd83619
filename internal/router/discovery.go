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
	"github.com/cacheroute/cacheroute/internal/fleet"
	"github.com/cacheroute/cacheroute/internal/kubeapi"
	"github.com/cacheroute/cacheroute/internal/kvevents"
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
		for _, sel := range cfg.Selectors() { // one watch per role
			src, err := discovery.NewKubernetes(discovery.KubernetesOptions{
				Client: client, Namespace: ns, Selector: sel.Selector, Port: cfg.ServiceDiscoveryPort, Role: sel.Role, Log: log,
			})
			if err != nil {
				return nil, fmt.Errorf("--service-discovery: %w", err)
			}
			out = append(out, src)
		}
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

// reconciler keeps the pool in step with the sets the sources report, through the fleet: each
// source joins the workers it reports and leaves those it stops reporting, so a worker that two
// sources report stays until both stop. It drains only the workers that discovery registered: a
// URL that --worker-urls or the admin API registered first is held by them too, so it is neither
// drained nor removed by discovery.
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
//     sessions re-place at their next turn. An address change is a leave and a join, and so is
//     a role change (a pod relabelled from one role's selector to another's).
type reconciler struct {
	r   *Router
	ctx context.Context // the probes'

	mu       sync.Mutex
	sets     map[string][]discovery.Endpoint // the last set of each source
	owned    map[string]*member              // URL → a worker discovery joined
	shadowed map[string]bool                 // URLs wanted but refused by the fleet (logged once)
}

type member struct {
	url        tenant.URL
	name       string                                    // where it came from, for logs
	role       workers.Role                              // the role it joined with
	sources    map[fleet.Source]bool                     // the discovery sources that joined it
	kv         map[fleet.Source]kvevents.WorkerEndpoints // the event endpoints each named for it
	registered bool                                      // discovery registered it, so discovery drains it
	draining   bool                                      // wanted state; the workers' flag follows once an undrain probe is done
	gen        int                                       // changes with every drain and undrain, so a late probe knows it is stale
}

// wanted is one URL as all the sources together report it.
type wanted struct {
	discovery.Endpoint // ready when any source says so
	url                tenant.URL
	sources            map[fleet.Source]bool                     // the sources that report it
	kv                 map[fleet.Source]kvevents.WorkerEndpoints // the event endpoints each names for it
}

// apply records source's set and brings the pool in line with all the sets together: a URL
// that any source reports is wanted, and ready when any source says so. Sources that report one
// URL in two roles are a conflict: the first source by name decides, and the others are logged.
func (rc *reconciler) apply(source string, set []discovery.Endpoint) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	rc.sets[source] = set
	want := map[string]*wanted{}
	for _, s := range slices.Sorted(maps.Keys(rc.sets)) {
		for _, e := range rc.sets[s] {
			u, err := tenant.ParseURL(e.URL)
			if err != nil {
				rc.r.log.Warn("discovery: endpoint ignored", "source", s, "endpoint", e.Name, "error", err)
				continue
			}
			w := want[u.String()]
			switch {
			case w == nil:
				want[u.String()] = &wanted{Endpoint: e, url: u, sources: map[fleet.Source]bool{fleet.Source(s): true},
					kv: map[fleet.Source]kvevents.WorkerEndpoints{fleet.Source(s): e.KVEvents}}
			case w.Role != e.Role:
				rc.r.log.Warn("discovery: endpoint ignored in a second role", "source", s, "endpoint", e.Name, "role", e.Role, "kept", w.Role)
			default:
				w.Ready = w.Ready || e.Ready
				w.sources[fleet.Source(s)] = true
				w.kv[fleet.Source(s)] = e.KVEvents
			}
		}
	}
	for _, url := range slices.Sorted(maps.Keys(rc.owned)) {
		m := rc.owned[url]
		w := want[url]
		if w == nil || w.Role != m.role || len(rc.r.fleet.Holders(m.url)) == 0 {
			// Gone, relabelled, or removed through the admin API meanwhile (then joined again).
			rc.leave(url)
			continue
		}
		for s := range w.sources {
			switch {
			case !m.sources[s]:
				_, _ = rc.r.fleet.Join(rc.ctx, s, m.url, m.role, w.kv[s]) // held already: only adds s
				m.sources[s] = true
			case m.kv[s] != w.kv[s]:
				// A pod's annotation changed: the subscription follows within a second.
				if err := rc.r.fleet.SetKVEvents(s, m.url, w.kv[s]); err != nil {
					rc.r.log.Warn("discovery: kv events endpoint not changed", "worker", m.url.Redacted(), "endpoint", m.name, "error", err)
				}
			}
			m.kv[s] = w.kv[s]
		}
		for _, s := range slices.Sorted(maps.Keys(m.sources)) {
			if !w.sources[s] {
				_, _ = rc.r.fleet.Leave(s, m.url) // another source still holds it
				delete(m.sources, s)
				delete(m.kv, s)
			}
		}
	}
	for url := range rc.shadowed {
		if _, ok := want[url]; !ok {
			delete(rc.shadowed, url)
		}
	}
	for _, url := range slices.Sorted(maps.Keys(want)) {
		w := want[url]
		m := rc.owned[url]
		switch {
		case m == nil && w.Ready:
			rc.join(w)
		case m == nil:
			// Never ready while discovered: nothing to do until it is.
		case !m.registered:
			// Held by --worker-urls or the admin API too: theirs to drain, not discovery's.
		case !w.Ready && !m.draining:
			m.draining = true
			m.gen++
			setDraining(rc.r.pool.Get(url), true)
			rc.r.log.Info("worker draining", "worker", m.url.Redacted(), "endpoint", m.name)
		case w.Ready && m.draining:
			m.draining = false
			m.gen++
			rc.undrain(url, m, m.gen)
		}
	}
}

// join joins w through the fleet for each source that reports it; the fleet probes it in the
// background, and until the probe passes it takes nothing.
func (rc *reconciler) join(w *wanted) {
	m := &member{url: w.url, name: w.Name, role: w.Role, sources: map[fleet.Source]bool{}, kv: map[fleet.Source]kvevents.WorkerEndpoints{}}
	var err error
	for _, s := range slices.Sorted(maps.Keys(w.sources)) {
		var j fleet.Joined
		if j, err = rc.r.fleet.Join(rc.ctx, s, w.url, w.Role, w.kv[s]); err != nil {
			break
		}
		m.sources[s] = true
		m.kv[s] = w.kv[s]
		m.registered = m.registered || j.New
	}
	url := w.url.String()
	if err != nil {
		for s := range m.sources {
			_, _ = rc.r.fleet.Leave(s, w.url) // undoing this join
		}
		if !rc.shadowed[url] {
			rc.shadowed[url] = true
			rc.r.log.Warn("discovery: worker not added", "worker", w.url.Redacted(), "endpoint", w.Name, "role", w.Role, "error", err)
		}
		return
	}
	if !m.registered && !rc.shadowed[url] {
		rc.shadowed[url] = true
		rc.r.log.Info("discovery: worker already registered by flag or admin API; left to them", "worker", w.url.Redacted(), "endpoint", w.Name)
	}
	rc.owned[url] = m
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
			rc.r.log.Info("worker ready again", "worker", m.url.Redacted(), "endpoint", m.name, "healthy", ts[0].Healthy())
		}
	}()
}

// leave has every discovery source that joined url leave it; the fleet removes it, with
// everything that names it, unless --worker-urls or the admin API holds it too.
func (rc *reconciler) leave(url string) {
	m := rc.owned[url]
	delete(rc.owned, url)
	for _, s := range slices.Sorted(maps.Keys(m.sources)) {
		if _, err := rc.r.fleet.Leave(s, m.url); err != nil && !errors.Is(err, fleet.ErrNotFound) {
			rc.r.log.Warn("discovery: worker not removed", "worker", m.url.Redacted(), "endpoint", m.name, "error", err)
		}
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
