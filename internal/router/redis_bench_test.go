package router

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/session/redistest"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// The cost of the shared session store: the same work with the in-process memory store and with
// the Redis store (behind its fallback) on a loopback redis-server. Follow-up turns of known
// sessions, the common case: one GETEX per request with Redis.

var sessionStores = []string{"memory", "redis"}

const benchSessions = 256

// sessionChats returns one chat body and one header per session.
func sessionChats(n int) ([][]byte, []http.Header) {
	bodies := make([][]byte, n)
	headers := make([]http.Header, n)
	for i := range n {
		bodies[i] = fmt.Appendf(nil, `{"model":"m","messages":[{"role":"system","content":"Session %d. %s"},{"role":"user","content":"Continue with step %d."}]}`,
			i, strings.Repeat("You are a coding agent in a large repository. ", 40), i)
		headers[i] = http.Header{"X-Session-Id": {fmt.Sprintf("bench-session-%d", i)}}
	}
	return bodies, headers
}

// storeConfig is a cache_aware configuration with the given session store; a Redis server is
// started for "redis".
func storeConfig(b *testing.B, store string) config.Config {
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	if store == "redis" {
		srv := redistest.Start(b)
		cfg.SessionStore, cfg.RedisURL = "redis", srv.URL()
	}
	return cfg
}

// BenchmarkSessionStoreDecision is the cache_aware decision for one request (parse, session
// look-up, tree match and insert) over 8 workers, without HTTP.
func BenchmarkSessionStoreDecision(b *testing.B) {
	for _, store := range sessionStores {
		b.Run(store, func(b *testing.B) {
			cfg := storeConfig(b, store)
			pool := workers.NewPool(workers.Options{DPSize: 1, CBFailureThreshold: 10, CBTimeout: time.Second})
			for i := range 8 {
				added, err := pool.Add(fmt.Sprintf("http://10.0.0.%d:8000", i+1))
				if err != nil {
					b.Fatal(err)
				}
				added[0].SetHealthy(true)
			}
			m := metrics.New(pool)
			p, shared, err := newPolicy(cfg, m, slog.New(slog.NewTextHandler(io.Discard, nil)), nil, nil)
			if err != nil {
				b.Fatal(err)
			}
			if shared != nil {
				b.Cleanup(func() { _ = shared.redis.Close() })
			}
			bodies, headers := sessionChats(benchSessions)
			selectOne := func(i int) string {
				r, err := protocol.ParseChat(headers[i], bodies[i])
				if err != nil {
					b.Fatal(err)
				}
				return p.Select(policy.Input{Context: context.Background(), Request: r, Candidates: pool.All(), All: pool.All()}).Label
			}
			for i := range benchSessions { // first turns: place every session
				selectOne(i)
			}
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if label := selectOne(i % benchSessions); label != cacheaware.LabelSessionMatch {
					b.Fatalf("decision %s, want session_id_match", label)
				}
				i++
			}
			b.ReportMetric(testutil.ToFloat64(m.SessionStoreErrors.WithLabelValues("get")), "store-errors")
		})
	}
}

// BenchmarkSessionStoreRouter sends follow-up chat turns through one router to four loopback
// workers over HTTP: serial (one client; ns/op is the latency a request sees) and parallel (32
// clients; req/s is the router's throughput on this machine).
func BenchmarkSessionStoreRouter(b *testing.B) {
	for _, store := range sessionStores {
		for _, mode := range []string{"serial", "parallel"} {
			b.Run(store+"/"+mode, func(b *testing.B) {
				cfg := storeConfig(b, store)
				for range 4 {
					w := httptest.NewServer(stubChatWorker)
					b.Cleanup(w.Close)
					cfg.WorkerURLs = append(cfg.WorkerURLs, w.URL)
				}
				r, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
				if err != nil {
					b.Fatal(err)
				}
				if r.store != nil {
					b.Cleanup(func() { _ = r.store.redis.Close() })
				}
				r.Start(b.Context())
				front := serveForBench(b, r)
				client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
				bodies, headers := sessionChats(benchSessions)
				send := func(i int) {
					req, _ := http.NewRequest(http.MethodPost, front+"/v1/chat/completions", strings.NewReader(string(bodies[i])))
					req.Header = headers[i].Clone()
					req.Header.Set("Content-Type", "application/json")
					resp, err := client.Do(req)
					if err != nil {
						b.Error(err)
						return
					}
					_, _ = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if resp.StatusCode != http.StatusOK {
						b.Errorf("status %d", resp.StatusCode)
					}
				}
				for i := range benchSessions {
					send(i)
				}
				b.ReportAllocs()
				start := time.Now()
				if mode == "serial" {
					i := 0
					for b.Loop() {
						send(i % benchSessions)
						i++
					}
				} else {
					b.SetParallelism(16) // 32 clients on 2 cores
					b.ResetTimer()
					var next atomic.Int64
					b.RunParallel(func(pb *testing.PB) {
						for pb.Next() {
							send(int(next.Add(1)) % benchSessions)
						}
					})
				}
				b.ReportMetric(float64(b.N)/time.Since(start).Seconds(), "req/s")
				b.ReportMetric(testutil.ToFloat64(r.Metrics().SessionStoreErrors.WithLabelValues("get")), "store-errors")
			})
		}
	}
}
