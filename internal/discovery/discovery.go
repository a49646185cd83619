// Package discovery finds workers: each Source watches one place where workers are listed
// (Kubernetes pods, DNS records) and reports the whole set of workers it wants, every time that
// set changes. It decides nothing about routing; the router reconciles its pool with the sets.
package discovery

import (
	"context"
	"slices"
	"strings"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Endpoint is one worker a source wants in the pool.
type Endpoint struct {
	// URL is the worker's base URL ("http://10.1.2.3:8000").
	URL string
	// Ready is false for a worker that must take no new request while those it has finish: a
	// pod that is not Ready or is terminating. A source leaves out a worker that should go.
	Ready bool
	// Name says where the endpoint came from, for logs ("llm/vllm-0" for a pod).
	Name string
	// Role is the part of requests the worker takes: the role of the source's selector.
	Role workers.Role
	// KVEvents are the KV-cache event endpoints the worker names for itself (a pod's
	// annotations); zero for none.
	KVEvents kvevents.WorkerEndpoints
}

// Source reports the wanted worker set.
type Source interface {
	// Name names the source in logs and errors ("kubernetes", "dns").
	Name() string
	// Run watches until ctx ends. It calls update with the whole wanted set, sorted by URL, once
	// it knows it and then each time it changes; the calls are sequential. Run returns when ctx
	// ends, or earlier with an error when it cannot watch at all.
	Run(ctx context.Context, update func([]Endpoint)) error
}

// normalize sorts eps by URL and merges duplicates (two records for one address), ready when
// any of them is.
func normalize(eps []Endpoint) []Endpoint {
	slices.SortFunc(eps, func(a, b Endpoint) int { return strings.Compare(a.URL, b.URL) })
	out := eps[:0]
	for _, e := range eps {
		if n := len(out); n > 0 && out[n-1].URL == e.URL {
			out[n-1].Ready = out[n-1].Ready || e.Ready
			continue
		}
		out = append(out, e)
	}
	return slices.Clip(out)
}

// Equal reports whether two sets, as Run reports them, are the same.
func Equal(a, b []Endpoint) bool { return slices.Equal(a, b) }
