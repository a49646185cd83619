package sim

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"sync"
	"time"
)

// Fleet is a set of workers, each serving HTTP on its own listener.
type Fleet struct {
	workers []*Worker
	servers []*http.Server
	urls    []string
	wg      sync.WaitGroup
	errs    chan error
}

// StartLocal starts n workers on free loopback ports (127.0.0.1:0), for
// tests, demos and benchmarks. Close stops them.
func StartLocal(n int, cfg Config) (*Fleet, error) {
	if n < 1 {
		return nil, fmt.Errorf("sim: need at least one worker, got %d", n)
	}
	addrs := make([]string, n)
	for i := range addrs {
		addrs[i] = "127.0.0.1:0"
	}
	return Start(addrs, cfg)
}

// Start starts one worker per address, each with its own cache, scheduler
// and metrics. It returns once every listener is bound; on any failure the
// workers already started are stopped.
func Start(addrs []string, cfg Config) (*Fleet, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	f := &Fleet{errs: make(chan error, len(addrs))}
	for n, addr := range addrs {
		wcfg := cfg
		var err error
		if wcfg.KVEvents, err = cfg.KVEvents.Offset(n); err != nil { // worker n publishes on port+n
			f.Close()
			return nil, err
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("sim: listen on %s: %w", addr, err)
		}
		w, err := NewWorker(wcfg)
		if err != nil {
			ln.Close()
			f.Close()
			return nil, err
		}
		name := ln.Addr().String()
		w.SetName(name)
		srv := &http.Server{
			Handler:           w,
			ReadHeaderTimeout: 10 * time.Second,
			// Fault injection aborts connections on purpose; keep those out
			// of the log.
			ErrorLog: log.New(io.Discard, "", 0),
		}
		f.workers = append(f.workers, w)
		f.servers = append(f.servers, srv)
		f.urls = append(f.urls, "http://"+name)
		f.wg.Add(1)
		go func() {
			defer f.wg.Done()
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				f.errs <- fmt.Errorf("sim: serve %s: %w", name, err)
			}
		}()
	}
	return f, nil
}

// URLs returns the base URL of every worker ("http://127.0.0.1:port").
func (f *Fleet) URLs() []string { return append([]string(nil), f.urls...) }

// Workers returns the workers, in the order of URLs.
func (f *Fleet) Workers() []*Worker { return append([]*Worker(nil), f.workers...) }

// Err returns a channel that receives an error when a server stops serving
// for any reason other than Close or Shutdown.
func (f *Fleet) Err() <-chan error { return f.errs }

// Shutdown stops accepting connections and waits for running requests until
// ctx ends; then it closes what is left.
func (f *Fleet) Shutdown(ctx context.Context) error {
	for _, w := range f.workers {
		w.Close() // release stalled requests so they do not hold the shutdown
	}
	var errs []error
	for _, s := range f.servers {
		if err := s.Shutdown(ctx); err != nil {
			errs = append(errs, err)
			s.Close()
		}
	}
	f.wg.Wait()
	return errors.Join(errs...)
}

// Close stops every worker at once, dropping open connections.
func (f *Fleet) Close() {
	for _, w := range f.workers {
		w.Close()
	}
	for _, s := range f.servers {
		s.Close()
	}
	f.wg.Wait()
}
