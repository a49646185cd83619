package enginemetrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Options configure a Scraper.
type Options struct {
	// Interval is the time between two scrapes of a worker (--worker-metrics-interval).
	Interval time.Duration
	// Timeout bounds one scrape; 0 means nine tenths of Interval, so that a scrape has ended
	// before the next one of the same worker is due.
	Timeout time.Duration
	// Dialer connects to the workers and sends each its credential, as for every other call to
	// a worker (--worker-url-allow, TLS, --api-key or the URL's user:password@).
	Dialer upstream.Dialer
}

// maxPageBytes bounds the page read from one worker. A filtered page is a few hundred bytes; a
// worker that ignores the filter sends its whole page, some hundreds of KiB for vLLM.
const maxPageBytes = 8 << 20

// Scraper reads every worker URL's /metrics each interval and records the figures on the URL's
// tenants (Worker.SetEngine), or counts the failure (Worker.ScrapeFailed).
//
// Each worker is scraped on its own goroutine over its own kept-alive connection, at most one
// scrape per worker at a time: a slow or silent worker only delays itself, and its scrape is cut
// off at Timeout, before the next is due (a scrape still under way when its next is due skips
// that round). The workers are read from the pool every round, so one added through the admin
// API or discovery is scraped from the next round on, and one removed is forgotten.
type Scraper struct {
	pool  *workers.Pool
	opts  Options
	log   *slog.Logger
	query string // "?name[]=...", built once

	mu     sync.Mutex
	busy   map[string]bool  // worker URLs with a scrape under way
	conns  map[string]*conn // idle kept-alive connections, by worker URL
	rounds int
	wg     sync.WaitGroup
}

// New returns a scraper of pool's workers; call Run to start it.
func New(pool *workers.Pool, opts Options, log *slog.Logger) *Scraper {
	if opts.Timeout <= 0 {
		opts.Timeout = opts.Interval * 9 / 10
	}
	q := url.Values{"name[]": Names}
	return &Scraper{pool: pool, opts: opts, log: log, query: "/metrics?" + q.Encode(),
		busy: map[string]bool{}, conns: map[string]*conn{}}
}

// Run scrapes every worker at once and then every Interval until ctx ends; it returns once the
// scrapes under way have stopped, with the connections closed.
func (s *Scraper) Run(ctx context.Context) {
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
	defer s.Close()
	defer s.wg.Wait()
	for {
		s.round(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Close closes the idle connections to the workers.
func (s *Scraper) Close() {
	s.mu.Lock()
	for u, c := range s.conns {
		c.close()
		delete(s.conns, u)
	}
	s.mu.Unlock()
}

// round starts a scrape of every worker URL that has none under way, without waiting for them.
func (s *Scraper) round(ctx context.Context) {
	urls := s.pool.URLs()
	s.mu.Lock()
	if s.rounds++; s.rounds%16 == 0 && len(s.conns) > 0 {
		s.forgetRemoved(urls)
	}
	s.mu.Unlock()
	for _, u := range urls {
		s.mu.Lock()
		if s.busy[u] {
			s.mu.Unlock()
			continue
		}
		s.busy[u] = true
		s.mu.Unlock()
		s.wg.Go(func() {
			_ = s.Scrape(ctx, u)
			s.mu.Lock()
			delete(s.busy, u)
			s.mu.Unlock()
		})
	}
}

// forgetRemoved closes the connections of worker URLs no longer in the pool; s.mu is held.
func (s *Scraper) forgetRemoved(urls []string) {
	live := make(map[string]bool, len(urls))
	for _, u := range urls {
		live[u] = true
	}
	for u, c := range s.conns {
		if !live[u] {
			c.close()
			delete(s.conns, u)
		}
	}
}

// ScrapeAll scrapes every worker URL now, concurrently, and waits for all of them (tests and
// tools; Run does not wait for a round).
func (s *Scraper) ScrapeAll(ctx context.Context) {
	var wg sync.WaitGroup
	for _, u := range s.pool.URLs() {
		wg.Go(func() { _ = s.Scrape(ctx, u) })
	}
	wg.Wait()
}

var pages = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// Scrape reads one worker URL's metrics now and records the outcome on all its tenants. It
// returns why the scrape failed, without the worker's credentials; a page without the load
// metrics is no failure, and neither is a scrape cut short because ctx ended (shutdown).
func (s *Scraper) Scrape(ctx context.Context, workerURL string) error {
	tenants := s.pool.Get(workerURL)
	if len(tenants) == 0 {
		return nil // removed meanwhile
	}
	deadline := time.Now().Add(s.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var one [1]workers.ScrapeMark
	marks := one[:0]
	for _, w := range tenants {
		marks = append(marks, w.BeginScrape())
	}
	buf := pages.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= 1<<20 { // keep small buffers only; a whole unfiltered page is rare
			buf.Reset()
			pages.Put(buf)
		}
	}()
	buf.Reset()
	err := s.fetch(ctx, workerURL, buf, deadline)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		for _, w := range tenants {
			w.ScrapeFailed()
		}
		if s.log != nil {
			s.log.Debug("worker metrics scrape failed", "worker", tenant.Redact(workerURL), "reason", err.Error())
		}
		return err
	}
	stats, ok := Parse(buf.Bytes())
	for i, w := range tenants {
		w.SetEngine(marks[i], stats, ok)
	}
	return nil
}

// fetch reads the page into buf over the worker's kept-alive connection, or a new one. A kept
// connection that the worker had closed (no status line came back) is replaced once.
func (s *Scraper) fetch(ctx context.Context, workerURL string, buf *bytes.Buffer, deadline time.Time) error {
	s.mu.Lock()
	c := s.conns[workerURL]
	delete(s.conns, workerURL)
	s.mu.Unlock()
	for attempt := 0; ; attempt++ {
		reused := c != nil
		if c == nil {
			t, err := newTarget(s.opts.Dialer, workerURL, s.query)
			if err != nil {
				return err
			}
			dctx, cancel := context.WithDeadline(ctx, deadline)
			c, err = dial(dctx, s.opts.Dialer, t)
			cancel()
			if err != nil {
				return fetchError(err, s.opts.Timeout)
			}
		}
		buf.Reset()
		status, keep := 0, false
		err := c.send(deadline)
		if err == nil {
			status, keep, err = c.receive(buf)
		}
		if err != nil || !keep {
			c.close()
		}
		if err != nil && reused && status == 0 && attempt == 0 && time.Now().Before(deadline) {
			c = nil
			continue
		}
		if err != nil {
			return fetchError(err, s.opts.Timeout)
		}
		if keep {
			s.mu.Lock()
			if s.conns[workerURL] == nil {
				s.conns[workerURL] = c
			} else {
				c.close()
			}
			s.mu.Unlock()
		}
		if status != 200 {
			return fmt.Errorf("GET /metrics answered %d", status)
		}
		return nil
	}
}

// fetchError names why a scrape failed, without the request URL (which may carry credentials).
func fetchError(err error, timeout time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("GET /metrics: no answer within %s", timeout)
	}
	return fmt.Errorf("GET /metrics: %v", err)
}
