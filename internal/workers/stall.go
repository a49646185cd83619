package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// A worker can hang in a way its health endpoint does not show: /health and /v1/models answer,
// but no generation moves. Nothing in its answers tells such a worker from one busy with long
// non-streamed generations (their bytes come only at the end), so the checker asks it: a worker
// that has had requests in flight for HealthOptions.StallTimeout without sending a byte on any
// of them is sent a probe request, a one-token chat completion. One that does not answer it
// within the stall timeout is stalled: out of rotation like an unhealthy worker (its sessions
// move at their next turn), and the proxy fails the attempts still waiting on it for their first
// byte, which may go elsewhere since nothing reached their clients. A busy worker answers its
// probe, and its long generations are never cut.
//
// A worker is also found stalled at once, without that wait, when a request's first-byte
// deadline passed on it and it sent no byte of any answer for as long (Attempt.MissedFirstByte):
// the request that saw it could not be served in time, and the following ones should not wait
// on the same worker.
//
// A stalled worker, however it was found, is probed again every stall check and comes back at the
// first probe request answered. The probe needs a model to name: a worker whose /v1/models said
// none is never held stalled.

// stallCheckEvery is how often the checker looks for stalled workers.
const stallCheckEvery = time.Second

// Progressed records that the worker sent a byte of an answer (the proxy calls it on every read).
func (w *Worker) Progressed() { w.progress.Store(monoNow()) }

// Stalled reports whether the worker was found stalled (see the checker's stall checks).
func (w *Worker) Stalled() bool { return w.stalled.Load() }

// SetStalled records a stall verdict; the checker sets it, tests use it.
func (w *Worker) SetStalled(stalled bool) { w.stalled.Store(stalled) }

// MissedFirstByte is told by the proxy that the attempt got no byte of its answer before its
// request's first-byte deadline. A worker that has sent no byte on any request for timeout (the
// first-byte timeout) is then taken for stalled at once, with every tenant of its URL: the
// following requests go elsewhere, and the attempts still waiting on it for a first byte fail
// over. One that sent bytes meanwhile is busy, not stalled, and stays. It reports whether this
// call marked the worker.
func (a *Attempt) MissedFirstByte(timeout time.Duration) bool {
	tenants := a.pool.Get(a.worker.URL())
	if len(tenants) == 0 || tenants[0].Stalled() {
		return false // removed meanwhile, or already out
	}
	silentSince := monoNow() - int64(timeout)
	for _, w := range tenants {
		if w.progress.Load() > silentSince {
			return false
		}
	}
	for _, w := range tenants {
		w.SetStalled(true)
	}
	return true
}

// probeTimeout bounds a probe request: the stall timeout, or without stall checks (a worker is
// then found stalled only by a missed first byte) the health check's timeout.
func (c *Checker) probeTimeout() time.Duration {
	if c.opts.StallTimeout > 0 {
		return c.opts.StallTimeout
	}
	return c.opts.Timeout
}

// checkStalls starts a probe request, each on its own goroutine and one at a time per worker
// URL, to every worker that is suspect (requests in flight, no byte for the stall timeout; only
// with stall checks on) or stalled.
func (c *Checker) checkStalls(ctx context.Context) {
	now := monoNow()
	for _, url := range c.pool.URLs() {
		tenants := c.pool.Get(url)
		if len(tenants) == 0 || !tenants[0].Healthy() {
			continue // the health checks have it
		}
		var inFlight, last int64
		for _, w := range tenants {
			inFlight += w.InFlight()
			last = max(last, w.progress.Load())
		}
		stalled := tenants[0].Stalled()
		if !stalled && (c.opts.StallTimeout <= 0 || inFlight == 0 || time.Duration(now-last) < c.opts.StallTimeout) {
			continue
		}
		c.mu.Lock()
		pc := c.counts[url]
		busy := pc == nil || pc.stallProbing
		if !busy {
			pc.stallProbing = true
		}
		c.mu.Unlock()
		if busy {
			continue
		}
		c.stallProbes.Go(func() {
			err := c.probeRequest(ctx, url, tenants[0].Models())
			c.mu.Lock()
			if pc := c.counts[url]; pc != nil {
				pc.stallProbing = false
			}
			c.mu.Unlock()
			c.stallVerdict(url, tenants, err)
		})
	}
}

// stallVerdict applies the outcome of a probe request to every tenant of url.
func (c *Checker) stallVerdict(url string, tenants []*Worker, err error) {
	was := tenants[0].Stalled()
	for _, w := range tenants {
		if err == nil {
			w.Progressed() // answered: not suspect again before another stall timeout
		}
		w.SetStalled(err != nil)
	}
	switch {
	case err != nil && !was:
		c.log.Warn("worker stalled: no progress on its requests and no answer to a probe request; out of rotation",
			"worker", tenant.Redact(url), "stall_timeout", c.opts.StallTimeout, "reason", err.Error())
	case err == nil && was:
		c.log.Info("stalled worker answered a probe request; back in rotation", "worker", tenant.Redact(url))
	}
}

// probeRequest asks the worker at url for one token of a chat completion, within probeTimeout,
// and returns nil when it answered 2xx. models are the worker's models; the probe names
// the first. A worker whose models are unknown is not asked: nil.
func (c *Checker) probeRequest(ctx context.Context, base string, models []string) error {
	if len(models) == 0 {
		// Without a model to name, a refusal would say nothing of the engine: no verdict.
		return nil
	}
	req := map[string]any{"model": models[0], "messages": []map[string]string{{"role": "user", "content": "ping"}}, "max_tokens": 1, "stream": false}
	body, _ := json.Marshal(req)
	ctx, cancel := context.WithTimeout(ctx, c.probeTimeout())
	defer cancel()
	r, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(string(body)))
	if err != nil {
		return err
	}
	r.Header.Set("Content-Type", "application/json")
	resp, err := c.client.Do(r)
	if err != nil {
		if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
			return fmt.Errorf("probe request POST /v1/chat/completions: no answer within %s", c.probeTimeout())
		}
		var uerr *url.Error
		if errors.As(err, &uerr) {
			err = uerr.Err // without the URL: the worker is named beside it, without credentials
		}
		return fmt.Errorf("probe request POST /v1/chat/completions: %v", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return fmt.Errorf("probe request POST /v1/chat/completions answered %s", statusText(resp.StatusCode))
	}
	return nil
}
