package routerapi

import (
	"context"
	"encoding/json"
	"maps"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/fleet"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// The helpers below serve the API over loopback (httptest), in front of test workers on
// 127.0.0.1 registered healthy in the pool.

// testAPI is a running API.
type testAPI struct {
	URL  string
	API  *API
	Pool *workers.Pool
}

// newTestAPI serves an API over the workers at urls until the test ends. opts' Pool, Metrics,
// Upstream and MaxPayloadSize are filled in when unset.
func newTestAPI(t *testing.T, opts Options, urls ...string) *testAPI {
	t.Helper()
	pool := workers.NewPool(workers.Options{CBFailureThreshold: 3, CBTimeout: time.Minute})
	for _, u := range urls {
		ws, err := pool.Add(u)
		if err != nil {
			t.Fatalf("add worker %s: %v", u, err)
		}
		for _, w := range ws {
			w.SetHealthy(true)
		}
	}
	opts.Pool = pool
	if opts.Metrics == nil {
		opts.Metrics = metrics.New(pool).Handler()
	}
	if opts.Upstream.Timeouts.Request == 0 {
		opts.Upstream.Timeouts = upstream.Timeouts{Dial: 2 * time.Second, Idle: time.Minute, Request: 20 * time.Second}
	}
	if opts.MaxPayloadSize == 0 {
		opts.MaxPayloadSize = 1 << 20
	}
	api := New(opts)
	srv := httptest.NewServer(api)
	t.Cleanup(srv.Close)
	return &testAPI{URL: srv.URL, API: api, Pool: pool}
}

// do sends a request with an optional body and header pairs, and returns the status, headers and
// whole body of the answer.
func (ta *testAPI) do(t *testing.T, method, path, body string, header ...string) (int, http.Header, string) {
	t.Helper()
	return testkit.Send(t, nil, method, ta.URL+path, body, header...)
}

// remote answers a request as if it came from addr, which the network tests cannot do (they use
// loopback only).
func (ta *testAPI) remote(method, path, body, addr string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.RemoteAddr = addr
	maps.Copy(req.Header, testkit.Header(header...))
	rec := httptest.NewRecorder()
	ta.API.ServeHTTP(rec, req)
	return rec
}

// errorCode is the code of an OpenAI error body, failing the test on any other body.
func errorCode(t *testing.T, body string) string {
	t.Helper()
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Code == "" {
		t.Fatalf("not an OpenAI error body (%v): %q", err, body)
	}
	return e.Error.Code
}

// probeRecorder is a Fleet that joins every worker at once and records the workers probed.
type probeRecorder struct {
	mu     sync.Mutex
	probed []string
}

func (f *probeRecorder) Join(context.Context, fleet.Source, tenant.URL, workers.Role, kvevents.WorkerEndpoints) (fleet.Joined, error) {
	probed := make(chan struct{})
	close(probed)
	return fleet.Joined{New: true, Probed: probed}, nil
}
func (f *probeRecorder) Remove(tenant.URL) error { return nil }
func (f *probeRecorder) CheckWorker(_ context.Context, url string) {
	f.mu.Lock()
	f.probed = append(f.probed, url)
	f.mu.Unlock()
}
