package bench

import (
	"context"
	"fmt"

	"github.com/cacheroute/cacheroute/internal/haproxyproc"
	"github.com/cacheroute/cacheroute/internal/sim"
)

// HAProxyPolicy is the --policies entry that puts HAProxy (from PATH), not a router, in front of
// the simulated workers: a sticky proxy. With session ids in the header (mode header), a stick
// table keeps each session on the worker its first request was balanced to, round robin; without
// them (mode none) every request is balanced round robin. HAProxy cannot read the body, so mode
// body is refused. The bench starts and stops the process on a loopback port.
const HAProxyPolicy = "haproxy"

// routerless reports whether a --policies entry of policy runs without a cacheroute router.
func routerless(policy string) bool { return policy == OraclePolicy || policy == HAProxyPolicy }

// runHAProxy runs the workload through an HAProxy in front of fleet.
func runHAProxy(ctx context.Context, o *Options, rep *Report, p PolicySpec, fleet *sim.Fleet, model string) error {
	stick := ""
	switch p.SessionMode {
	case SessionHeader:
		stick = headerSessionID
	case SessionBody:
		return fmt.Errorf("--policies %s: HAProxy sticks on the x-session-id header, not on the body: use %s:header or %s:none", p.Name, HAProxyPolicy, HAProxyPolicy)
	}
	px, err := haproxyproc.Start(haproxyproc.Config{Workers: fleet.URLs(), StickHeader: stick, Timeout: o.Timeout})
	if err != nil {
		return fmt.Errorf("--policies %s: %w", p.Name, err)
	}
	defer px.Close()
	t := &Target{Name: p.Name, URLs: []string{px.URL()}, SessionMode: p.SessionMode, Policy: p.Policy,
		Loads: func() []float64 { return simLoads(fleet.Workers()) }, Workers: o.Workers, WorkerMetrics: fleet.URLs(),
		TimeScale: o.Sim.TimeScale, KVCapacityTokens: o.kvCapacity()}
	tr, err := runOne(ctx, o, t, model)
	if err != nil {
		return err
	}
	rep.Targets = append(rep.Targets, tr)
	return ctx.Err()
}

// simLoads are the running and waiting requests of each simulated worker.
func simLoads(ws []*sim.Worker) []float64 {
	out := make([]float64, len(ws))
	for i, w := range ws {
		s := w.Stats()
		out[i] = float64(s.Running + s.Waiting)
	}
	return out
}
