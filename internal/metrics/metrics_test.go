package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// A counter whose series appears only at its first event gives rate() and alerts nothing to work
// on until then: every upstream error kind has its series, at 0, from the start.
func TestNew_EveryUpstreamErrorKindHasASeriesFromTheStart(t *testing.T) {
	m := New(workers.NewPool(workers.Options{}))
	if got := testutil.CollectAndCount(m.UpstreamErrors); got != len(upstream.Kinds) {
		t.Errorf("upstream_errors_total has %d series at start, want %d (one per kind)", got, len(upstream.Kinds))
	}
}

// A worker's own counters exist from the moment it joins, so that a per-worker rate() or an
// alert on a worker that never served anything has a series; ForgetWorker takes them away again.
func TestWorkerAdded_CreatesTheWorkersSeriesAndForgetWorkerRemovesThem(t *testing.T) {
	m := New(workers.NewPool(workers.Options{}))
	m.WorkerAdded("cache_aware", []string{"session_id_match", "full_history_match"}, "http://w:8000")
	m.WorkerAdded("cache_aware", []string{"session_id_match", "full_history_match"}, "http://v:8000")
	perWorker := map[string]struct {
		vec  *prometheus.CounterVec
		want int
	}{
		"processed_requests_total": {m.Processed, 1}, "policy_decisions_total": {m.PolicyDecisions, 1},
		"cache_aware_corrections_total": {m.CacheCorrections, 1},
		// one per decision label: the status page and the alert rules sum them by worker
		"prompt_tokens_total": {m.PromptTokens, 2}, "cached_tokens_predicted_total": {m.CachedTokensPredicted, 2},
		"cached_tokens_achieved_total": {m.CachedTokensAchieved, 2},
	}
	for name, c := range perWorker {
		if got := testutil.CollectAndCount(c.vec); got != 2*c.want {
			t.Errorf("%s has %d series for 2 workers, want %d", name, got, 2*c.want)
		}
	}
	if got := testutil.ToFloat64(m.PromptTokens.WithLabelValues("http://w:8000", "full_history_match")); got != 0 {
		t.Errorf("prompt_tokens_total starts at %v", got)
	}
	m.ForgetWorker("http://w:8000")
	for name, c := range perWorker {
		if got := testutil.CollectAndCount(c.vec); got != c.want {
			t.Errorf("%s has %d series after ForgetWorker of one of 2 workers, want %d", name, got, c.want)
		}
	}
}

// vllm_router_worker_role is 1 for each worker tenant, labelled with its role.
func TestWorkerRoleIsAnInfoGaugePerTenant(t *testing.T) {
	pool := workers.NewPool(workers.Options{DPSize: 2})
	ts, err := pool.Add("http://127.0.0.1:8000")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range ts {
		w.SetRole(workers.RolePrefill)
	}
	m := New(pool)
	want := `
# HELP vllm_router_worker_role 1 for each worker tenant, labelled with its role under prefill/decode disaggregation (colocated, prefill or decode).
# TYPE vllm_router_worker_role gauge
vllm_router_worker_role{role="prefill",worker="http://127.0.0.1:8000@0"} 1
vllm_router_worker_role{role="prefill",worker="http://127.0.0.1:8000@1"} 1
`
	if err := testutil.GatherAndCompare(m.Registry, strings.NewReader(want), "vllm_router_worker_role"); err != nil {
		t.Fatal(err)
	}
}
