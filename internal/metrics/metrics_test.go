package metrics

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/workers"
)

// A counter whose series appears only at its first event gives rate() and alerts nothing to work
// on until then: every upstream error kind has its series, at 0, from the start.
func TestNew_EveryUpstreamErrorKindHasASeriesFromTheStart(t *testing.T) {
	m := New(workers.NewPool(workers.Options{}))
	if got := testutil.CollectAndCount(m.UpstreamErrors); got != len(UpstreamErrorKinds) {
		t.Errorf("upstream_errors_total has %d series at start, want %d (one per kind)", got, len(UpstreamErrorKinds))
	}
	for _, kind := range []string{ErrConnect, ErrReset, ErrFirstByte, ErrTimeout, ErrStatus, ErrSent, ErrMidStream, ErrBadReply, ErrStalled} {
		found := false
		for _, k := range UpstreamErrorKinds {
			found = found || k == kind
		}
		if !found {
			t.Errorf("kind %q is not in UpstreamErrorKinds", kind)
		}
	}
}

// A worker's own counters exist from the moment it joins, so that a per-worker rate() or an
// alert on a worker that never served anything has a series; ForgetWorker takes them away again.
func TestWorkerAdded_CreatesTheWorkersSeriesAndForgetWorkerRemovesThem(t *testing.T) {
	m := New(workers.NewPool(workers.Options{}))
	m.WorkerAdded("round_robin", "http://w:8000")
	if got := testutil.CollectAndCount(m.Processed); got != 1 {
		t.Errorf("processed_requests_total has %d series, want 1", got)
	}
	if got := testutil.CollectAndCount(m.PolicyDecisions); got != 1 {
		t.Errorf("policy_decisions_total has %d series, want 1", got)
	}
	m.ForgetWorker("http://w:8000")
	if got := testutil.CollectAndCount(m.Processed) + testutil.CollectAndCount(m.PolicyDecisions); got != 0 {
		t.Errorf("%d series left after ForgetWorker", got)
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
