package workers

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// HealthOptions configure the active health checker.
type HealthOptions struct {
	Endpoint         string // path probed with GET, e.g. /health
	Interval         time.Duration
	Timeout          time.Duration
	FailureThreshold int // consecutive failed probes that mark a healthy worker unhealthy
	SuccessThreshold int // consecutive passed probes that mark an unhealthy worker healthy
	// StallTimeout is how long a worker with requests in flight may send no byte before it is
	// sent a probe request, and how long that may take (stall.go); 0: no stall checks (a worker
	// found stalled by a missed first byte is still probed, within Timeout).
	StallTimeout time.Duration
}

// Checker probes every worker URL of a pool on an interval. A probe passes when the endpoint
// answers 2xx within the timeout; each pass also refreshes the worker's models from /v1/models.
// A worker's first probe after registration decides its state at once, and so does its first
// passing probe when it has never passed one (it was still starting: there is no flapping to
// guard against); after that the thresholds apply, so one lost probe does not drop a worker and
// one lucky probe does not bring back a failing one.
//
// A worker that has never passed a probe is probed again soon rather than at the interval: after
// startupRetryFirst, doubling after each failure up to the interval. A fleet that comes up just
// after the router (or a worker added while it still loads) is routable as soon as it answers,
// not an interval or two later.
//
// A failed probe's reason (the status it answered, a refused connection, a timeout, ...) is kept
// on the worker (Worker.Probe) and logged: at once when a worker's probes start failing, then at
// most once per failureLogEvery while they keep failing, and once when they pass again. A worker
// that never comes up therefore says why, without a line per probe.
type Checker struct {
	pool   *Pool
	opts   HealthOptions
	client *http.Client
	log    *slog.Logger
	now    func() time.Time // time.Now; tests move it

	mu     sync.Mutex
	counts map[string]*probeCounts // by worker URL
	// wake tells Run that a worker's start-up probe schedule changed (a first probe failed).
	wake chan struct{}
	// stallProbes are the probe requests in flight (stall.go).
	stallProbes sync.WaitGroup
}

// startupRetryFirst is the wait before the second probe of a worker whose probes have never
// passed; each failed probe doubles it, up to the health interval.
const startupRetryFirst = 100 * time.Millisecond

// failureLogEvery is the least time between two log lines about one worker whose probes keep
// failing.
const failureLogEvery = time.Minute

type probeCounts struct {
	probed              bool
	passed              bool // a probe has passed since the worker was registered
	startupProbing      bool // a start-up probe is in flight
	stallProbing        bool // a probe request is in flight (stall.go)
	retryAt             time.Time
	retryAfter          time.Duration // the start-up backoff: the wait after the last failure
	successes, failures int
	failingSince        time.Time // first failure of the current run; zero while passing
	lastLogged          time.Time // last line logged about this run of failures
}

// ProbeStatus is what the health checker last learned about a worker beyond its verdict.
type ProbeStatus struct {
	LastError     string    // why the last failed probe failed
	LastErrorTime time.Time // when it failed
	Failures      int       // consecutive failed probes; 0 once one passes
}

// Probe reports the worker's last failed health probe; ok is false while none has failed.
func (w *Worker) Probe() (status ProbeStatus, ok bool) {
	if p := w.probe.Load(); p != nil {
		return *p, true
	}
	return ProbeStatus{}, false
}

// NewChecker returns a checker for pool; call Run to start it. client makes every probe, read
// of /v1/models and probe request: the router's upstream.Dialer.Client, which dials workers as
// every other call to them and sends each the worker's credential.
func NewChecker(pool *Pool, opts HealthOptions, client *http.Client, log *slog.Logger) *Checker {
	return &Checker{pool: pool, opts: opts, client: client, log: log, now: time.Now, counts: map[string]*probeCounts{},
		wake: make(chan struct{}, 1)}
}

// Run probes all workers every interval, the workers that have never passed a probe on their
// start-up schedule, and the workers suspect of a stall every stallCheckEvery, until ctx ends.
func (c *Checker) Run(ctx context.Context) {
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	startup := time.NewTimer(0)
	defer startup.Stop()
	stalls := time.NewTicker(stallCheckEvery) // a missed first byte finds a stall without stall checks too
	defer stalls.Stop()
	var probes sync.WaitGroup
	defer probes.Wait()
	defer c.stallProbes.Wait()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.CheckAll(ctx)
		case <-stalls.C:
			c.checkStalls(ctx)
			continue
		case <-startup.C:
		case <-c.wake:
		}
		startup.Reset(c.startupProbes(ctx, &probes))
	}
}

// startupProbes starts, each on its own goroutine, the due probes of the workers that have never
// passed one, and returns the wait until the next is due (the interval when none is).
func (c *Checker) startupProbes(ctx context.Context, probes *sync.WaitGroup) time.Duration {
	now := c.now()
	next := c.opts.Interval
	var due []string
	c.mu.Lock()
	for _, url := range c.pool.URLs() {
		pc := c.counts[url]
		if pc == nil || !pc.probed || pc.passed || pc.startupProbing || pc.retryAfter >= c.opts.Interval {
			continue // never probed (its registration probes it), up once, being probed, or left to the round
		}
		if wait := pc.retryAt.Sub(now); wait > 0 {
			next = min(next, wait)
			continue
		}
		pc.startupProbing = true
		due = append(due, url)
	}
	c.mu.Unlock()
	for _, url := range due {
		probes.Go(func() {
			c.Check(ctx, url)
			c.mu.Lock()
			if pc := c.counts[url]; pc != nil {
				pc.startupProbing = false
			}
			c.mu.Unlock()
			c.poke()
		})
	}
	return next
}

// poke wakes Run to look at the start-up schedule again; it never blocks.
func (c *Checker) poke() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// CheckAll probes every registered worker URL concurrently and waits for all probes.
func (c *Checker) CheckAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, url := range c.pool.URLs() {
		wg.Go(func() { c.Check(ctx, url) })
	}
	wg.Wait()
	c.forgetRemoved()
}

// Check probes one worker URL now and applies the verdict to all its tenants.
func (c *Checker) Check(ctx context.Context, url string) {
	probeErr := c.probe(ctx, url)
	ok := probeErr == nil
	var models []string
	var adapters map[string]string
	if ok {
		models, adapters = c.fetchModels(ctx, url)
	}
	tenants := c.pool.Get(url)
	if len(tenants) == 0 {
		return // removed meanwhile
	}
	now := c.now()
	c.mu.Lock()
	pc := c.counts[url]
	if pc == nil {
		pc = &probeCounts{}
		c.counts[url] = pc
	}
	was := tenants[0].Healthy()
	healthy := was
	rescheduled := false // its next start-up probe is due at a new time
	var logLine func()
	if ok {
		if pc.failures > 0 {
			failures, since := pc.failures, pc.failingSince
			logLine = func() {
				c.log.Info("worker health check passed", "worker", tenant.Redact(url),
					"after_failures", failures, "failing_for", now.Sub(since).Round(time.Second))
			}
		}
		pc.successes++
		pc.failures = 0
		pc.failingSince, pc.lastLogged = time.Time{}, time.Time{}
		if !pc.passed || pc.successes >= c.opts.SuccessThreshold {
			healthy = true
		}
		pc.passed = true
	} else {
		pc.failures++
		pc.successes = 0
		if !pc.passed {
			pc.retryAfter = min(max(2*pc.retryAfter, startupRetryFirst), c.opts.Interval)
			pc.retryAt = now.Add(pc.retryAfter)
			rescheduled = true
		}
		if !pc.probed || pc.failures >= c.opts.FailureThreshold {
			healthy = false
		}
		failures, since := pc.failures, pc.failingSince
		switch {
		case failures == 1:
			pc.failingSince, pc.lastLogged = now, now
			logLine = func() {
				c.log.Warn("worker health check failed", "worker", tenant.Redact(url), "reason", probeErr.Error(), "healthy", healthy)
			}
		case now.Sub(pc.lastLogged) >= failureLogEvery:
			pc.lastLogged = now
			logLine = func() {
				c.log.Warn("worker health check still failing", "worker", tenant.Redact(url), "reason", probeErr.Error(),
					"failures", failures, "failing_for", now.Sub(since).Round(time.Second), "healthy", healthy)
			}
		}
	}
	pc.probed = true
	failures := pc.failures
	c.mu.Unlock()
	if rescheduled {
		c.poke()
	}

	for _, w := range tenants {
		w.SetHealthy(healthy)
		if models != nil {
			w.adapters.Store(&adapters)
			w.models.Store(&models)
		}
		if !ok {
			w.probe.Store(&ProbeStatus{LastError: probeErr.Error(), LastErrorTime: now, Failures: failures})
		} else if p := w.probe.Load(); p != nil && p.Failures != 0 {
			kept := *p
			kept.Failures = 0
			w.probe.Store(&kept)
		}
	}
	if logLine != nil {
		logLine()
	}
	if was != healthy {
		c.log.Info("worker health changed", "worker", tenant.Redact(url), "healthy", healthy)
	}
}

func (c *Checker) forgetRemoved() {
	live := map[string]bool{}
	for _, u := range c.pool.URLs() {
		live[u] = true
	}
	c.mu.Lock()
	for u := range c.counts {
		if !live[u] {
			delete(c.counts, u)
		}
	}
	c.mu.Unlock()
}

// probe asks the health endpoint of the worker at url and returns nil when it answered 2xx, else
// why not, in words that name the cause: the status, a refused connection, a timeout, a name
// that does not resolve. The reason never carries the worker's credentials.
func (c *Checker) probe(ctx context.Context, url string) error {
	resp, err := c.get(ctx, url+c.opts.Endpoint)
	if err != nil {
		return probeError(c.opts.Endpoint, c.opts.Timeout, err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	if resp.StatusCode < 200 || resp.StatusCode >= 300 {
		return fmt.Errorf("GET %s answered %s", c.opts.Endpoint, statusText(resp.StatusCode))
	}
	return nil
}

// probeError turns the error of a health request into its reason, without the request URL (the
// worker is named beside it, without its credentials).
func probeError(endpoint string, timeout time.Duration, err error) error {
	if errors.Is(err, context.DeadlineExceeded) || isTimeout(err) {
		return fmt.Errorf("GET %s: no answer within %s (--health-check-timeout-secs)", endpoint, timeout)
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	return fmt.Errorf("GET %s: %v", endpoint, err)
}

func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// statusText is "404 Not Found", or the bare code when it has no standard name.
func statusText(code int) string {
	if text := http.StatusText(code); text != "" {
		return fmt.Sprintf("%d %s", code, text)
	}
	return fmt.Sprint(code)
}

// fetchModels reads the ids of GET /v1/models, and the parent of each that has one: vLLM lists a
// LoRA adapter with "parent" its base model (and a base model with parent null). nil when the
// worker does not say.
func (c *Checker) fetchModels(ctx context.Context, url string) ([]string, map[string]string) {
	resp, err := c.get(ctx, url+"/v1/models")
	if err != nil {
		return nil, nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, nil
	}
	var list struct {
		Data []struct {
			ID     string `json:"id"`
			Parent any    `json:"parent"` // a string, or null; anything else is no parent
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return nil, nil
	}
	models := make([]string, 0, len(list.Data))
	var adapters map[string]string
	for _, m := range list.Data {
		if m.ID == "" {
			continue
		}
		models = append(models, m.ID)
		if parent, _ := m.Parent.(string); parent != "" && parent != m.ID {
			if adapters == nil {
				adapters = map[string]string{}
			}
			adapters[m.ID] = parent
		}
	}
	return models, adapters
}

func (c *Checker) get(ctx context.Context, url string) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	resp, err := c.client.Do(req)
	if err != nil {
		cancel()
		return nil, err
	}
	resp.Body = &cancelOnClose{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// cancelOnClose releases the probe's timeout context together with the body.
type cancelOnClose struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (c *cancelOnClose) Close() error {
	err := c.ReadCloser.Close()
	c.cancel()
	return err
}
