package routerapi

import (
	"net/http"
	"time"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// WorkerInfo is one tenant as the health and admin endpoints show it.
type WorkerInfo struct {
	URL     string   `json:"url"`
	Tenant  string   `json:"worker"`
	DPRank  *int     `json:"dp_rank,omitempty"`
	Role    string   `json:"role"` // colocated, prefill or decode
	Models  []string `json:"models"`
	Healthy bool     `json:"healthy"`
	Load    int64    `json:"load"`
	Breaker string   `json:"circuit_breaker"`
	// The last failed health probe, once one has failed: why (the status it answered, a refused
	// connection, a timeout, ...), when, and how many probes in a row have failed since the last
	// pass (0: the worker passes again). Shown with the worker list only, to the callers that may
	// see worker URLs.
	LastProbeError     string     `json:"last_probe_error,omitempty"`
	LastProbeErrorTime *time.Time `json:"last_probe_error_time,omitempty"`
	ProbeFailures      *int       `json:"consecutive_probe_failures,omitempty"`
	// KVEvents is the tenant's KV-cache event stream, while the router subscribes to it.
	KVEvents *WorkerKVEvents `json:"kv_events,omitempty"`
}

// WorkerKVEvents is one tenant's KV-cache event stream as the worker lists show it: where the
// router dials it, whether its index has every batch since the publisher's first (complete: the
// events, not the prefix tree, speak for this worker), and the stored blocks it could not index
// (orphaned: a stream of orphans alone indexes nothing while every other count looks healthy).
type WorkerKVEvents struct {
	Endpoint       string `json:"endpoint"`
	Replay         string `json:"replay_endpoint,omitempty"`
	Complete       bool   `json:"complete"`
	Blocks         int    `json:"blocks"`
	OrphanedBlocks int64  `json:"orphaned_blocks"`
}

func describeWorker(w *workers.Worker) WorkerInfo {
	info := WorkerInfo{URL: w.BaseName(), Tenant: w.Name(), Models: w.Models(), Healthy: w.Healthy(), Load: w.Load(), Breaker: w.Breaker().State().String(), Role: w.Role().String()}
	if w.Rank() >= 0 {
		rank := w.Rank()
		info.DPRank = &rank
	}
	if st, ok := w.Probe(); ok {
		at, failures := st.LastErrorTime.UTC(), st.Failures
		info.LastProbeError, info.LastProbeErrorTime, info.ProbeFailures = st.LastError, &at, &failures
	}
	return info
}

// describeWorkers shows ws, each with its event stream when the router subscribes to it.
func (a *API) describeWorkers(ws []*workers.Worker) []WorkerInfo {
	var streams map[tenant.ID]kvevents.Status
	if a.opts.KVEvents != nil {
		all := a.opts.KVEvents()
		streams = make(map[tenant.ID]kvevents.Status, len(all))
		for _, st := range all {
			streams[st.Worker] = st
		}
	}
	out := make([]WorkerInfo, 0, len(ws))
	for _, w := range ws {
		info := describeWorker(w)
		if st, ok := streams[w.ID()]; ok {
			info.KVEvents = &WorkerKVEvents{Endpoint: st.Endpoint, Replay: st.Replay, Complete: st.Complete, Blocks: st.Blocks, OrphanedBlocks: st.Orphans}
		}
		out = append(out, info)
	}
	return out
}

func (a *API) healthyCount() int {
	n := 0
	for _, w := range a.opts.Pool.All() {
		if w.Healthy() {
			n++
		}
	}
	return n
}

// health is 200 while at least one worker is healthy, else 503. Its body always gives the worker
// counts by state; the worker list itself (URLs, models, load: the fleet's topology) only to a
// caller with the admin key, or to anyone when no admin key is configured and the caller is on
// loopback. With a shared session store the body gives the store's state too (which never
// changes the status: the router routes without the store).
func (a *API) health(w http.ResponseWriter, r *http.Request) {
	status, code := "healthy", http.StatusOK
	all := a.opts.Pool.All()
	counts := map[string]int{"total": len(all), "healthy": 0, "available": 0, "circuit_open": 0}
	for _, wk := range all {
		if wk.Healthy() {
			counts["healthy"]++
		}
		if wk.Available() {
			counts["available"]++
		}
		if wk.Breaker().State() == workers.BreakerOpen {
			counts["circuit_open"]++
		}
	}
	if counts["healthy"] == 0 {
		status, code = "unhealthy", http.StatusServiceUnavailable
	}
	body := map[string]any{"status": status, "worker_counts": counts}
	detail := a.mayShowTopology(r)
	if detail {
		body["workers"] = a.describeWorkers(all)
	}
	if a.opts.SessionStore != nil {
		body["session_store"] = a.opts.SessionStore(r.Context(), detail)
	}
	writeJSON(w, code, body)
}

// mayShowTopology reports whether r may see worker URLs: it carries the admin key, or no admin
// key is configured and r is a local caller (see localCaller).
func (a *API) mayShowTopology(r *http.Request) bool {
	if a.opts.AdminAPIKey != "" {
		return a.isAdmin(r)
	}
	return a.localCaller(r)
}

// liveness is always 200: the process is up and serving HTTP.
func (a *API) liveness(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "alive"})
}

// readiness is 200 once at least one worker is healthy, so a load balancer only sends traffic to
// a router that can place it.
func (a *API) readiness(w http.ResponseWriter, r *http.Request) {
	if a.healthyCount() == 0 {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"status": "not_ready"})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

// models lists the union of models served by healthy workers in the OpenAI list format.
func (a *API) models(w http.ResponseWriter, r *http.Request) {
	type model struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Created int64  `json:"created"`
		OwnedBy string `json:"owned_by"`
	}
	data := []model{}
	now := time.Now().Unix()
	for _, m := range a.opts.Pool.Models() {
		data = append(data, model{ID: m, Object: "model", Created: now, OwnedBy: "cacheroute"})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}
