package router

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strings"
	"time"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/tenant"
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
	resolved := map[string]resolvedEndpoints{} // by worker name, for workers whose host had to be resolved
	tick := time.NewTicker(kvEventsSyncInterval)
	defer tick.Stop()
	for {
		r.kvEvents.Sync(ctx, r.kvSources(ctx, resolved))
		select {
		case <-ctx.Done():
			r.kvEvents.Close()
			return
		case <-tick.C:
		}
	}
}

// resolvedEndpoints are a worker's endpoints with its host resolved and checked against
// --worker-url-allow.
type resolvedEndpoints struct{ events, replay string }

// kvSources are the event streams of the fleet's workers. With --worker-url-allow, a worker
// whose host is a name is resolved once and its address checked, as every connection to a worker
// is; a worker outside the list is not subscribed to.
func (r *Router) kvSources(ctx context.Context, resolved map[string]resolvedEndpoints) []kvevents.Source {
	ws := r.pool.All()
	out := make([]kvevents.Source, 0, len(ws))
	seen := make(map[string]bool, len(ws))
	for _, w := range ws {
		seen[w.Name()] = true
		u, err := url.Parse(w.URL())
		if err != nil {
			continue
		}
		ep, ok := resolved[w.Name()]
		if !ok {
			// A worker's own endpoint (--kv-events-worker-endpoints) names its host; the template
			// takes the worker URL's. Either host is dialled only once checked.
			template, host, replay := r.cfg.KVEventsEndpoint, u.Hostname(), r.cfg.KVEventsReplayEndpoint
			if own, ok := r.kvWorkerEndpoints[w.URL()]; ok {
				template, replay = own, ""
				if eu, err := url.Parse(own); err == nil && eu.Hostname() != "" {
					host = eu.Hostname()
					template = strings.Replace(own, eu.Host, net.JoinHostPort(kvevents.HostPlaceholder, eu.Port()), 1)
				}
			}
			if template == "" {
				continue // no template, and no endpoint of its own
			}
			checked, err := r.kvEventsHost(ctx, host)
			if err != nil {
				r.log.Warn("kv events: worker not subscribed to", "worker", w.Name(), "error", err)
				continue
			}
			if ep.events, err = kvevents.Endpoint(template, checked, w.Rank()); err != nil {
				continue // validated at start; a worker host that makes it unusable is skipped
			}
			if replay != "" {
				ep.replay, _ = kvevents.Endpoint(replay, checked, w.Rank())
			}
			resolved[w.Name()] = ep
		}
		out = append(out, kvevents.Source{Worker: w.Name(), Endpoint: ep.events, Replay: ep.replay, Topic: r.cfg.KVEventsTopic})
	}
	for name := range resolved {
		if !seen[name] {
			delete(resolved, name)
		}
	}
	return out
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
