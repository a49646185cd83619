package router

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"slices"
	"sort"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// kvevents.go subscribes to the workers' KV-cache event publishers (--kv-events-endpoint): once a
// second the set of subscriptions is made the fleet's, so a worker added by any path (the
// command line, the admin API, discovery) is subscribed to, and a removed one is dropped, with
// its blocks, within a second.

// kvEventsSyncInterval is how often the subscriptions follow the fleet.
const kvEventsSyncInterval = time.Second

// tokenCacheBytes bounds the prompt tokens remembered by history key, so a repeated prompt is not
// tokenized twice (16 MiB: some 4 million tokens).
const tokenCacheBytes = 16 << 20

// syncKVEvents keeps the subscriptions the fleet's until ctx ends, then stops them.
func (r *Router) syncKVEvents(ctx context.Context) {
	resolved := map[tenant.ID]resolvedEndpoints{} // by worker, for workers whose host had to be resolved
	replays := map[tenant.ID]string{}             // by worker: the replay endpoint of a worker read from the bound endpoint
	if r.kvBound != nil {
		if err := r.kvBound.Listen(ctx); err != nil {
			r.log.Error("kv events: --kv-events-bind: cannot bind; no publisher can dial the router", "endpoint", r.kvBound.Endpoint(), "error", err)
		}
	}
	tick := time.NewTicker(kvEventsSyncInterval)
	defer tick.Stop()
	for {
		dialled := r.kvSources(ctx, resolved)
		r.kvEvents.Sync(ctx, dialled)
		if r.kvBound != nil {
			r.kvBound.Sync(r.kvBoundWorkers(ctx, dialled, replays))
		}
		select {
		case <-ctx.Done():
			r.kvEvents.Close()
			return
		case <-tick.C:
		}
	}
}

// resolvedEndpoints are a worker's endpoints with its host resolved and checked against
// --worker-url-allow, and the templates they came from, so that new ones (a pod annotation that
// changed) are resolved again.
type resolvedEndpoints struct {
	from           kvevents.WorkerEndpoints
	events, replay string
}

// workerEventEndpoints are --kv-events-worker-endpoints by worker URL (validated with the
// configuration), for the fleet to give to workers of those URLs.
func workerEventEndpoints(cfg config.Config) map[tenant.URL]kvevents.WorkerEndpoints {
	out := make(map[tenant.URL]kvevents.WorkerEndpoints, len(cfg.KVEventsWorkerEndpoints))
	for worker, ep := range cfg.KVEventsWorkerEndpoints {
		if u, err := tenant.ParseURL(worker); err == nil {
			out[u] = kvevents.WorkerEndpoints{Events: ep}
		}
	}
	return out
}

// kvSources are the event streams of the fleet's workers: each at the endpoints its record in the
// fleet names (the admin API's, a pod annotation's, --kv-events-worker-endpoints), else at the
// --kv-events-endpoint template's. With --worker-url-allow, an endpoint whose host is a name is
// resolved once and its address checked, as every connection to a worker is; a worker outside the
// list is not subscribed to.
func (r *Router) kvSources(ctx context.Context, resolved map[tenant.ID]resolvedEndpoints) []kvevents.Source {
	ws := r.pool.All()
	out := make([]kvevents.Source, 0, len(ws))
	seen := make(map[tenant.ID]bool, len(ws))
	for _, w := range ws {
		seen[w.ID()] = true
		u, err := tenant.ParseURL(w.URL())
		if err != nil {
			continue
		}
		from := r.fleet.KVEvents(u)
		if from.IsZero() {
			from = kvevents.WorkerEndpoints{Events: r.cfg.KVEventsEndpoint, Replay: r.cfg.KVEventsReplayEndpoint}
		}
		ep, ok := resolved[w.ID()]
		if !ok || ep.from != from {
			if from.Events == "" {
				delete(resolved, w.ID())
				continue // no template, and no endpoint of its own
			}
			if ep, err = r.workerEndpoints(ctx, w, from); err != nil {
				r.log.Warn("kv events: worker not subscribed to", "worker", w.Name(), "error", err)
				delete(resolved, w.ID())
				continue
			}
			resolved[w.ID()] = ep
		}
		out = append(out, kvevents.Source{Worker: w.ID(), Endpoint: ep.events, Replay: ep.replay, Topic: r.cfg.KVEventsTopic})
	}
	for id := range resolved {
		if !seen[id] {
			delete(resolved, id)
		}
	}
	return out
}

// workerEndpoints are the endpoints of from for tenant w, each dialable: its host checked (see
// dialable) and its port offset by w's rank.
func (r *Router) workerEndpoints(ctx context.Context, w *workers.Worker, from kvevents.WorkerEndpoints) (resolvedEndpoints, error) {
	u, err := url.Parse(w.URL())
	if err != nil {
		return resolvedEndpoints{}, err
	}
	ep := resolvedEndpoints{from: from}
	if ep.events, err = r.dialable(ctx, from.Events, u.Hostname(), w.Rank()); err != nil {
		return resolvedEndpoints{}, err
	}
	if from.Replay != "" {
		if ep.replay, err = r.dialable(ctx, from.Replay, u.Hostname(), w.Rank()); err != nil {
			return resolvedEndpoints{}, err
		}
	}
	return ep, nil
}

// dialable is template's endpoint for a worker on workerHost: the placeholder replaced by that
// host, the endpoint's host then checked against --worker-url-allow (a name resolved to a
// permitted address) before anything dials it, and the port offset by rank.
func (r *Router) dialable(ctx context.Context, template, workerHost string, rank int) (string, error) {
	expanded, err := kvevents.Endpoint(template, workerHost, 0)
	if err != nil {
		return "", err
	}
	eu, err := url.Parse(expanded)
	if err != nil {
		return "", err
	}
	checked, err := r.kvEventsHost(ctx, eu.Hostname())
	if err != nil {
		return "", err
	}
	return kvevents.Endpoint("tcp://"+net.JoinHostPort(kvevents.HostPlaceholder, eu.Port()), checked, rank)
}

// kvEventsResolveTimeout bounds the resolution of one worker's host.
const kvEventsResolveTimeout = 2 * time.Second

// kvEventsHost is the host to dial for a worker's events: as given without --worker-url-allow,
// else its address, checked against the list.
func (r *Router) kvEventsHost(ctx context.Context, host string) (string, error) {
	if len(r.cfg.WorkerURLAllow) == 0 {
		return host, nil
	}
	if ip, err := netip.ParseAddr(host); err == nil {
		if !r.allowed.Permits(ip) {
			return "", fmt.Errorf("%s is %w", host, tenant.ErrNotAllowed)
		}
		return host, nil
	}
	rctx, cancel := context.WithTimeout(ctx, kvEventsResolveTimeout)
	defer cancel()
	ips, err := net.DefaultResolver.LookupNetIP(rctx, "ip", host)
	if err != nil {
		return "", err
	}
	for _, ip := range ips {
		if r.allowed.Permits(ip) {
			return ip.Unmap().String(), nil
		}
	}
	return "", fmt.Errorf("%s is %w", host, tenant.ErrNotAllowed)
}

// kvBoundWorkers are the fleet's workers read from the --kv-events-bind endpoint: every worker
// not dialled, named by the topics --kv-events-bind-topics gives its URL and by its URL's
// host:port (llm-d's kv@HOST:PORT@MODEL).
func (r *Router) kvBoundWorkers(ctx context.Context, dialled []kvevents.Source, replays map[tenant.ID]string) []kvevents.BoundWorker {
	skip := make(map[tenant.ID]bool, len(dialled))
	for _, src := range dialled {
		skip[src.Worker] = true
	}
	topics := make(map[string][]string, len(r.cfg.KVEventsBindTopics)) // by normalized worker URL
	for topic, worker := range r.cfg.KVEventsBindTopics {
		if u, err := tenant.NormalizeURL(worker); err == nil {
			topics[u] = append(topics[u], topic)
		}
	}
	ws := r.pool.All()
	out := make([]kvevents.BoundWorker, 0, len(ws))
	for _, w := range ws {
		if skip[w.ID()] {
			continue
		}
		u, err := url.Parse(w.URL())
		if err != nil {
			continue
		}
		port := u.Port()
		if port == "" {
			port = map[string]string{"http": "80", "https": "443"}[u.Scheme]
		}
		bw := kvevents.BoundWorker{Source: kvevents.Source{Worker: w.ID(), Replay: r.boundReplay(ctx, w, u, replays)},
			HostPort: net.JoinHostPort(u.Hostname(), port)}
		if n, err := tenant.NormalizeURL(w.URL()); err == nil {
			bw.Topics = topics[n]
			sort.Strings(bw.Topics)
		}
		out = append(out, bw)
	}
	for id := range replays {
		if !slices.ContainsFunc(ws, func(w *workers.Worker) bool { return w.ID() == id }) {
			delete(replays, id) // gone from the fleet
		}
	}
	return out
}

// boundReplay is the replay endpoint of worker w read from the bound endpoint: the
// --kv-events-replay-endpoint template at its host (vLLM's replay socket binds on the engine,
// whichever way its events go), checked as every endpoint dialled is, once per worker; "" without
// a template or when the check refuses it.
func (r *Router) boundReplay(ctx context.Context, w *workers.Worker, u *url.URL, replays map[tenant.ID]string) string {
	if r.cfg.KVEventsReplayEndpoint == "" {
		return ""
	}
	if ep, ok := replays[w.ID()]; ok {
		return ep
	}
	ep, err := r.dialable(ctx, r.cfg.KVEventsReplayEndpoint, u.Hostname(), w.Rank())
	if err != nil {
		r.log.Warn("kv events: no replay for a worker read from the bound endpoint", "worker", w.Name(), "error", err)
	}
	replays[w.ID()] = ep
	return ep
}
