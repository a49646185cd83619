package router

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/sim"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// BenchmarkTokenize measures what routing on KV-cache events adds to a chat completion without
// session id: the router's POST /tokenize to the engine before it places the request. One router
// (cache_aware) on loopback in front of two simulated workers (a request with one candidate is not
// tokenized) at time scale 0, so the workers answer at once and the latency is the router's and the round trips'; each request is one
// user message of the given size, sent one at a time, non-streamed (at time scale 0 its latency
// is its time to first token). Per size:
//
//   - events=off: the worker publishes no events, the router subscribes to none and never
//     tokenizes (the prefix tree routes);
//   - events=new: the worker publishes its events and the router subscribes, each request a new
//     prompt (its first bytes differ), so every one costs a /tokenize round trip;
//   - events=repeated: the same, one prompt sent again and again, answered by the router's
//     token cache after the first.
//
// Besides ns/op it reports the requests' p50 and p99 latency and the /tokenize calls per
// request. --tokenize-timeout-secs is raised to 10 s so that the whole round trip is measured
// rather than cut at the default 100 ms. Run on a quiet machine:
//
//	go test ./internal/router/ -run '^$' -bench 'Tokenize$' -benchtime=200x
func BenchmarkTokenize(b *testing.B) {
	for _, kib := range []int{4, 64, 512} {
		for _, mode := range []string{"off", "new", "repeated"} {
			b.Run(fmt.Sprintf("size=%dKiB/events=%s", kib, mode), func(b *testing.B) {
				benchTokenize(b, kib<<10, mode, 10, 0)
			})
		}
	}
}

// BenchmarkTokenizeDefaultTimeout is BenchmarkTokenize's events=new under the default
// --tokenize-timeout-secs (0.1), with no allowance per KiB and with the default
// --tokenize-timeout-per-kib-ms (0.5), up to 1 MiB (real agent prompts reach about 700 KiB), and reports
// the share of /tokenize calls cut off (timeouts/op):
//
//	go test ./internal/router/ -run '^$' -bench TokenizeDefaultTimeout -benchtime=100x
func BenchmarkTokenizeDefaultTimeout(b *testing.B) {
	for _, kib := range []int{64, 512, 700, 1024} {
		for _, perKiB := range []float64{0, config.Default().TokenizeTimeoutPerKiBMs} {
			b.Run(fmt.Sprintf("size=%dKiB/per-kib-ms=%g", kib, perKiB), func(b *testing.B) {
				benchTokenize(b, kib<<10, "new", 0, perKiB)
			})
		}
	}
}

// benchTokenize runs one case; timeoutSecs 0 keeps the default tokenize timeout, with perKiBMs
// its allowance per KiB.
func benchTokenize(b *testing.B, size int, mode string, timeoutSecs, perKiBMs float64) {
	simCfg := instantSim()
	simCfg.MaxModelLen = 1 << 20   // a 512 KiB message is about 130k of the sim's tokens
	simCfg.KVCacheBlocks = 1 << 15 // and fits in its cache
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.KVEventsWorkerEndpoints = map[string]string{}
	for range 2 { // a request with one candidate is not tokenized
		var endpoint string
		if mode != "off" {
			endpoint = "tcp://127.0.0.1:" + strconv.Itoa(testkit.FreePort(b))
			simCfg.KVEvents = sim.KVEventsConfig{Endpoint: endpoint, Bind: true}
		}
		fleet := startSimFleetOf(b, 1, simCfg)
		cfg.WorkerURLs = append(cfg.WorkerURLs, fleet.URLs()[0])
		if endpoint != "" {
			cfg.KVEventsWorkerEndpoints[fleet.URLs()[0]] = endpoint
		}
	}
	if timeoutSecs > 0 {
		cfg.TokenizeTimeoutSecs = timeoutSecs
	}
	cfg.TokenizeTimeoutPerKiBMs = perKiBMs
	r, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	r.Start(b.Context())
	front := serveForBench(b, r)
	client := &http.Client{}

	// The message: a request number, then words up to size bytes; "new" rewrites the number.
	const numWidth = 10
	head := []byte(`{"model":"sim-model","max_tokens":1,"messages":[{"role":"user","content":"`)
	body := append([]byte(nil), head...)
	body = append(body, bytes.Repeat([]byte("0"), numWidth)...)
	for words := 0; len(body) < len(head)+size; words++ {
		body = append(body, " request"[:1+words%7]...)
		body = append(body, "body"...)
	}
	body = append(body, `"}]}`...)
	send := func(n int) {
		if mode == "new" {
			copy(body[len(head):len(head)+numWidth], fmt.Sprintf("%0*d", numWidth, n))
		}
		resp, err := client.Post(front+"/v1/chat/completions", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("status %d", resp.StatusCode)
		}
	}
	send(0) // connections up, and for "repeated" the prompt's tokens in the cache
	calls0 := tokenizeCalls(b, r)
	timeouts0 := tokenizeResults(b, r, metrics.TokenizeTimeout)
	var took []time.Duration
	n := 0
	for b.Loop() {
		n++
		start := time.Now()
		send(n)
		took = append(took, time.Since(start))
	}
	b.StopTimer()
	calls := tokenizeCalls(b, r) - calls0
	if want := map[string]float64{"off": 0, "new": float64(n), "repeated": 0}[mode]; calls != want {
		b.Fatalf("events=%s: %v /tokenize calls for %d requests, want %v", mode, calls, n, want)
	}
	slices.Sort(took)
	ms := func(q float64) float64 {
		return float64(took[min(len(took)-1, int(q*float64(len(took))))]) / float64(time.Millisecond)
	}
	b.ReportMetric(ms(0.50), "p50-ms")
	b.ReportMetric(ms(0.99), "p99-ms")
	b.ReportMetric(calls/float64(n), "tokenize/op")
	b.ReportMetric((tokenizeResults(b, r, metrics.TokenizeTimeout)-timeouts0)/float64(n), "timeouts/op")
}

// tokenizeCalls is the router's calls to an engine's /tokenize: results ok, error and timeout.
func tokenizeCalls(b *testing.B, r *Router) float64 {
	return tokenizeResults(b, r, metrics.TokenizeOK, metrics.TokenizeError, metrics.TokenizeTimeout)
}

// tokenizeResults sums the router's tokenize requests of the given results.
func tokenizeResults(b *testing.B, r *Router, results ...string) float64 {
	b.Helper()
	var sum float64
	for _, result := range results {
		var m dto.Metric
		if err := r.Metrics().TokenizeRequests.WithLabelValues(result).Write(&m); err != nil {
			b.Fatal(err)
		}
		sum += m.GetCounter().GetValue()
	}
	return sum
}
