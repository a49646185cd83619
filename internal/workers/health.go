package workers

import (
	"context"
	"encoding/json"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// HealthOptions configure the active health checker.
type HealthOptions struct {
	Endpoint         string // path probed with GET, e.g. /health
	Interval         time.Duration
	Timeout          time.Duration
	FailureThreshold int    // consecutive failed probes that mark a healthy worker unhealthy
	SuccessThreshold int    // consecutive passed probes that mark an unhealthy worker healthy
	APIKey           string // sent as a bearer token when reading /v1/models
}

// Checker probes every worker URL of a pool on an interval. A probe passes when the endpoint
// answers 2xx within the timeout; each pass also refreshes the worker's models from /v1/models.
// A worker's first probe after registration decides its state at once; after that the
// thresholds apply, so one lost probe does not drop a worker and one lucky probe does not
// bring back a failing one.
type Checker struct {
	pool   *Pool
	opts   HealthOptions
	client *http.Client
	log    *slog.Logger

	mu     sync.Mutex
	counts map[string]*probeCounts // by worker URL
}

type probeCounts struct {
	probed              bool
	successes, failures int
}

// NewChecker returns a checker for pool; call Run to start it.
func NewChecker(pool *Pool, opts HealthOptions, client *http.Client, log *slog.Logger) *Checker {
	return &Checker{pool: pool, opts: opts, client: client, log: log, counts: map[string]*probeCounts{}}
}

// Run probes all workers every interval until ctx ends.
func (c *Checker) Run(ctx context.Context) {
	t := time.NewTicker(c.opts.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.CheckAll(ctx)
		}
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
	ok := c.probe(ctx, url)
	var models []string
	if ok {
		models = c.fetchModels(ctx, url)
	}
	tenants := c.pool.Get(url)
	if len(tenants) == 0 {
		return // removed meanwhile
	}
	c.mu.Lock()
	pc := c.counts[url]
	if pc == nil {
		pc = &probeCounts{}
		c.counts[url] = pc
	}
	was := tenants[0].Healthy()
	now := was
	if ok {
		pc.successes++
		pc.failures = 0
		if !pc.probed || pc.successes >= c.opts.SuccessThreshold {
			now = true
		}
	} else {
		pc.failures++
		pc.successes = 0
		if !pc.probed || pc.failures >= c.opts.FailureThreshold {
			now = false
		}
	}
	pc.probed = true
	c.mu.Unlock()

	for _, w := range tenants {
		w.SetHealthy(now)
		if models != nil {
			w.models.Store(&models)
		}
	}
	if was != now {
		c.log.Info("worker health changed", "worker", tenant.Redact(url), "healthy", now)
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

func (c *Checker) probe(ctx context.Context, url string) bool {
	resp, err := c.get(ctx, url+c.opts.Endpoint, false)
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}

// fetchModels reads the ids of GET /v1/models; nil when the worker does not say.
func (c *Checker) fetchModels(ctx context.Context, url string) []string {
	resp, err := c.get(ctx, url+"/v1/models", true)
	if err != nil {
		return nil
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&list); err != nil {
		return nil
	}
	models := make([]string, 0, len(list.Data))
	for _, m := range list.Data {
		if m.ID != "" {
			models = append(models, m.ID)
		}
	}
	return models
}

func (c *Checker) get(ctx context.Context, url string, auth bool) (*http.Response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.opts.Timeout)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		cancel()
		return nil, err
	}
	if auth && c.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.opts.APIKey)
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
