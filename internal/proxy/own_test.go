package proxy_test

import (
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/routerapi"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// The test routers serve the router's own endpoints as the router does: routerapi's API.
func init() {
	proxy.OwnEndpointsForTests = func(pool *workers.Pool, m *metrics.Metrics, opts proxy.Options) proxy.OwnEndpoints {
		return routerapi.New(routerapi.Options{Pool: pool, Metrics: m.Handler(), Upstream: opts.Upstream.Dialer,
			MaxPayloadSize: opts.MaxPayloadSize, ClientKeys: opts.ClientKeys})
	}
}
