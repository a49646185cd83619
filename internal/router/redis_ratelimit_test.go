package router

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/session/redistest"
)

func TestReplicasSharingRedisShareATenantsRateLimit(t *testing.T) {
	srv := redistest.Start(t)
	_, a, b := startRedisReplicas(t, srv, 2, func(c *config.Config) { c.TenantRPM = 3 })
	status := func(tr *testRouter) int {
		resp := tr.post(t, "/v1/chat/completions", `{"model":"`+simModel+`","max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`)
		readAll(t, resp)
		return resp.StatusCode
	}
	got := []int{status(a), status(b), status(a), status(b)}
	if got[0] != http.StatusOK || got[1] != http.StatusOK || got[2] != http.StatusOK || got[3] != http.StatusTooManyRequests {
		t.Fatalf("statuses %v across two replicas, want three 200s then 429 (one shared budget of 3 a minute)", got)
	}
	// With Redis gone each replica limits on its own, from a full local bucket: it fails open.
	srv.Stop()
	if s := status(a); s != http.StatusOK {
		t.Fatalf("with Redis stopped: %d, want 200 from the local fallback", s)
	}
	if n := testutil.ToFloat64(a.Metrics().SessionStoreErrors.WithLabelValues("ratelimit")); n < 1 {
		t.Fatalf("session_store_errors_total{op=ratelimit} = %v, want the outage counted", n)
	}
}
