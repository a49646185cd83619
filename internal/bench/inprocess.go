package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
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

// startRouter starts a router with the given policy in front of workerURLs and returns once
// every worker has been probed.
func startRouter(ctx context.Context, policy string, workerURLs []string) (*localRouter, error) {
	cfg := config.Default()
	cfg.Policy = policy
	cfg.WorkerURLs = workerURLs
	cfg.PrometheusPort = 0
	cfg.ShutdownGraceSecs = 5
	cfg.LogLevel = "error"
	r, err := router.New(cfg, slog.New(slog.DiscardHandler))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	r.Start(ctx)
	lr := &localRouter{r: r, url: "http://" + ln.Addr().String(), cancel: cancel, done: make(chan error, 1)}
	go func() { lr.done <- r.Serve(ctx, ln, nil) }()
	for _, w := range r.Pool().All() {
		if !w.Healthy() {
			lr.stop()
			return nil, fmt.Errorf("router %s: worker %s did not answer its health check", policy, w.Tenant())
		}
	}
	return lr, nil
}

// loads returns the router's in-flight count per worker tenant.
func (lr *localRouter) loads() []float64 {
	ws := lr.r.Pool().All()
	out := make([]float64, len(ws))
	for i, w := range ws {
		out[i] = float64(w.Load())
	}
	return out
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
