package bench

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/haproxyproc"
	"github.com/cacheroute/cacheroute/internal/sim"
)

// A sticky proxy as a front: HAProxy with a stick table on x-session-id keeps every later turn
// on its session's worker; without ids it balances every turn round robin.
func TestHAProxyFrontSticksOnTheSessionHeader(t *testing.T) {
	if _, err := haproxyproc.Start(haproxyproc.Config{}); errors.Is(err, haproxyproc.ErrNotInstalled) {
		t.Skip(err)
	}
	ps := mustPolicies(t, []string{"sticky=haproxy,plain=haproxy:none"}, SessionHeader)
	rep := mustRun(t, Options{Workload: replayAgent(t, 4), Policies: ps, Workers: 3, Sim: scaledSim(0.01),
		Concurrency: 2, Timeout: 30 * time.Second})
	sticky, plain := rep.Targets[0], rep.Targets[1]
	for _, tr := range rep.Targets {
		if tr.Errors != 0 || tr.Requests != 16 || tr.Policy != HAProxyPolicy || len(tr.WorkerShare) == 0 {
			t.Fatalf("%s: %d requests, errors %v, policy %q, shares %v", tr.Name, tr.Requests, tr.ErrorSamples, tr.Policy, tr.WorkerShare)
		}
	}
	if sticky.SameWorker == nil || *sticky.SameWorker != 1 {
		t.Fatalf("sticky: %v of later turns on their session's worker, want all", sticky.SameWorker)
	}
	if plain.SameWorker == nil || *plain.SameWorker > 0.5 {
		t.Fatalf("round robin over 3 workers: %v of later turns on their session's worker", plain.SameWorker)
	}
	if !(sticky.HitRate > plain.HitRate) {
		t.Fatalf("sticky hit rate %.3f, round robin %.3f", sticky.HitRate, plain.HitRate)
	}
}

func TestHAProxyFrontRefusesBodySessionIDsAndRouterArgs(t *testing.T) {
	ps := mustPolicies(t, []string{"h=haproxy:body"}, SessionHeader)
	if err := ApplyRouterArgs(ps, []string{"h=--cache-threshold=0.5"}); err == nil || !strings.Contains(err.Error(), "runs no router") {
		t.Fatalf("router arg for haproxy: %v", err)
	}
	_, err := Run(t.Context(), Options{Workload: replayAgent(t, 1), Policies: ps, Workers: 1, Sim: sim.DefaultConfig(), Concurrency: 1})
	if err == nil || !strings.Contains(err.Error(), "x-session-id header") {
		t.Fatalf("haproxy:body ran: %v", err)
	}
}
