package enginemetrics

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Options configure a Scraper.
type Options struct {
	// Interval is the time between two scrapes of a worker (--worker-metrics-interval).
	Interval time.Duration
	// Timeout bounds one scrape; 0 means nine tenths of Interval, so that a scrape has ended
	// before the next one of the same worker is due.
	Timeout time.Duration
	// APIKey is sent as a bearer token, as the health checker sends it to workers.
	APIKey string
}

// maxPageBytes bounds the page read from one worker. A filtered page is a few hundred bytes; a
// worker that ignores the filter sends its whole page, some hundreds of KiB for vLLM.
const maxPageBytes = 8 << 20

// Scraper reads every worker URL's /metrics each interval and records the figures on the URL's
// tenants (Worker.SetEngine), or counts the failure (Worker.ScrapeFailed).
//
// Each worker is scraped on its own goroutine, at most one scrape per worker at a time: a slow
// or silent worker only delays itself, and its scrape is cut off at Timeout, before the next is
// due (a scrape still under way when its next is due skips that round). The workers are read
// from the pool every round, so one added through the admin API or discovery is scraped from the
// next round on, and one removed is forgotten.
type Scraper struct {
	pool   *workers.Pool
	opts   Options
	client *http.Client
	log    *slog.Logger
	query  string // "/metrics?name[]=...", built once

	mu   sync.Mutex
	busy map[string]bool // worker URLs with a scrape under way
	wg   sync.WaitGroup
}

// New returns a scraper of pool's workers that uses client (the health checker's: the workers'
// TLS settings and address rules); call Run to start it.
func New(pool *workers.Pool, opts Options, client *http.Client, log *slog.Logger) *Scraper {
	if opts.Timeout <= 0 {
		opts.Timeout = opts.Interval * 9 / 10
	}
	q := url.Values{"name[]": Names}
	return &Scraper{pool: pool, opts: opts, client: client, log: log, query: "/metrics?" + q.Encode(), busy: map[string]bool{}}
}

// Run scrapes every worker at once and then every Interval until ctx ends; it returns once the
// scrapes under way have stopped.
func (s *Scraper) Run(ctx context.Context) {
	t := time.NewTicker(s.opts.Interval)
	defer t.Stop()
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

// round starts a scrape of every worker URL that has none under way, without waiting for them.
func (s *Scraper) round(ctx context.Context) {
	for _, u := range s.pool.URLs() {
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
// metrics is no failure.
func (s *Scraper) Scrape(ctx context.Context, workerURL string) error {
	tenants := s.pool.Get(workerURL)
	if len(tenants) == 0 {
		return nil // removed meanwhile
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
	err := s.fetch(ctx, workerURL, buf)
	if err != nil {
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

func (s *Scraper) fetch(ctx context.Context, workerURL string, buf *bytes.Buffer) error {
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, workerURL+s.query, nil)
	if err != nil {
		return errors.New("GET /metrics: bad worker URL")
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	if s.opts.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.opts.APIKey)
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return fetchError(err, s.opts.Timeout)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
		return fmt.Errorf("GET /metrics answered %d", resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); strings.Contains(ct, "protobuf") {
		return fmt.Errorf("GET /metrics answered %s, not the text format", ct)
	}
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, maxPageBytes+1))
	if err != nil {
		return fetchError(err, s.opts.Timeout)
	}
	if n > maxPageBytes {
		return fmt.Errorf("GET /metrics: page larger than %d bytes", maxPageBytes)
	}
	return nil
}

// fetchError names why a scrape failed, without the request URL (which may carry credentials).
func fetchError(err error, timeout time.Duration) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("GET /metrics: no answer within %s", timeout)
	}
	var uerr *url.Error
	if errors.As(err, &uerr) {
		err = uerr.Err
	}
	return fmt.Errorf("GET /metrics: %v", err)
}
