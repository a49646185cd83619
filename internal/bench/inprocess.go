package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/router"
	"github.com/cacheroute/cacheroute/internal/sim"
)

// localRouter is a cacheroute router running in this process on a loopback listener.
type localRouter struct {
	r      *router.Router
	url    string
	cancel context.CancelFunc
	done   chan error
}

// startRouter starts a router with configuration cfg (its workers included), listening on a
// port of ps, and returns once every worker has been probed. name names the router in errors.
func startRouter(ctx context.Context, cfg config.Config, name string, ps *ports) (*localRouter, error) {
	r, err := router.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, fmt.Errorf("router %s: %w", name, err)
	}
	ln, err := ps.listen()
	if err != nil {
		return nil, fmt.Errorf("router %s: %w", name, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	r.Start(ctx)
	lr := &localRouter{r: r, url: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { lr.done <- r.Serve(ctx, ln, nil) }()
	for _, w := range r.Pool().All() {
		if !w.Healthy() {
			lr.stop()
			return nil, fmt.Errorf("router %s: worker %s did not answer its health check", name, w.Name())
		}
	}
	return lr, nil
}

// replicaSet is the routers of one --policies entry, in front of the same workers.
type replicaSet []*localRouter

// startReplicas starts n routers with configuration cfg on ports of ps, or none if one fails.
func startReplicas(ctx context.Context, cfg config.Config, name string, n int, ps *ports) (replicaSet, error) {
	var rs replicaSet
	for i := range n {
		rname := name
		if n > 1 {
			rname = fmt.Sprintf("%s (replica %d)", name, i+1)
		}
		lr, err := startRouter(ctx, cfg, rname, ps)
		if err != nil {
			rs.stop()
			return nil, err
		}
		rs = append(rs, lr)
	}
	return rs, nil
}

// urls are the replicas' base URLs, which the bench's requests take in turn.
func (rs replicaSet) urls() []string {
	out := make([]string, len(rs))
	for i, lr := range rs {
		out[i] = lr.url
	}
	return out
}

// loads returns the requests in flight on each worker tenant, summed over the replicas: each
// replica counts only what it sent itself (InFlight, whatever load signal it balances on).
// Tenants are in the first replica's order and matched by name in the others.
func (rs replicaSet) loads() []float64 {
	if len(rs) == 0 {
		return nil
	}
	first := rs[0].r.Pool().All()
	out := make([]float64, len(first))
	index := make(map[string]int, len(first))
	for i, w := range first {
		index[w.Name()] = i
		out[i] = float64(w.InFlight())
	}
	for _, lr := range rs[1:] {
		for _, w := range lr.r.Pool().All() {
			if i, ok := index[w.Name()]; ok {
				out[i] += float64(w.InFlight())
			}
		}
	}
	return out
}

// stop shuts every replica down.
func (rs replicaSet) stop() {
	for _, lr := range rs {
		lr.stop()
	}
}

// stop shuts the router down and waits for it.
func (lr *localRouter) stop() error {
	lr.cancel()
	return <-lr.done
}

// idleWait bounds how long the bench waits for simulated workers to finish what they run.
const idleWait = 30 * time.Second

// resetFleet waits until no simulated worker runs or queues a request, then empties every
// prefix cache, so each policy starts from the same cold fleet.
func resetFleet(ctx context.Context, f *sim.Fleet) error {
	deadline := time.Now().Add(idleWait)
	for {
		busy := 0
		for _, w := range f.Workers() {
			st := w.Stats()
			busy += st.Running + st.Waiting
		}
		if busy == 0 {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("simulated workers still busy after the run")
		}
		if !sleepUntil(ctx, time.Now().Add(5*time.Millisecond)) {
			return ctx.Err()
		}
	}
	for _, w := range f.Workers() {
		w.ResetPrefixCache()
	}
	return nil
}
