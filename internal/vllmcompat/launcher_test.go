package vllmcompat

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/cli"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// routerArgs are what the vLLM router's fixture (RouterManager.start_router) is given.
type routerArgs struct {
	workerURLs []string
	policy     string // round_robin when empty, as the fixture's default
	// P/D options.
	pd                          bool
	prefill                     []prefillWorker
	decode                      []string
	prefillPolicy, decodePolicy string
	extra                       []extra // in the order given
	// own are cacheroute flags added after the fixture's command line, where a test departs from
	// the vLLM router's on purpose (each says why).
	own []string
}

// prefillWorker is a --prefill URL with its bootstrap port, "" for none.
type prefillWorker struct{ url, bootstrapPort string }

// extra is one of the fixture's extra options: a flag of its flag map, with a value.
type extra struct {
	key   string
	value any // bool: the flag alone when true; anything else: its value after the flag
}

// fixtureFlags is the fixture's map of extra options to flags.
var fixtureFlags = map[string]string{
	"max_payload_size":              "--max-payload-size",
	"intra_node_data_parallel_size": "--intra-node-data-parallel-size",
	"prefill_data_parallel_size":    "--prefill-data-parallel-size",
	"decode_data_parallel_size":     "--decode-data-parallel-size",
	"api_key":                       "--api-key",
	"worker_startup_check_interval": "--worker-startup-check-interval",
	"worker_startup_timeout_secs":   "--worker-startup-timeout-secs",
	"cache_threshold":               "--cache-threshold",
	"balance_abs_threshold":         "--balance-abs-threshold",
	"balance_rel_threshold":         "--balance-rel-threshold",
	"retry_max_retries":             "--retry-max-retries",
	"retry_initial_backoff_ms":      "--retry-initial-backoff-ms",
	"retry_max_backoff_ms":          "--retry-max-backoff-ms",
	"retry_backoff_multiplier":      "--retry-backoff-multiplier",
	"retry_jitter_factor":           "--retry-jitter-factor",
	"disable_retries":               "--disable-retries",
	"cb_failure_threshold":          "--cb-failure-threshold",
	"cb_success_threshold":          "--cb-success-threshold",
	"cb_timeout_duration_secs":      "--cb-timeout-duration-secs",
	"cb_window_duration_secs":       "--cb-window-duration-secs",
	"disable_circuit_breaker":       "--disable-circuit-breaker",
	"max_concurrent_requests":       "--max-concurrent-requests",
	"queue_size":                    "--queue-size",
	"queue_timeout_secs":            "--queue-timeout-secs",
	"rate_limit_tokens_per_second":  "--rate-limit-tokens-per-second",
	"wasm_middleware":               "--wasm-middleware",
	"wasm_middleware_sha256":        "--wasm-middleware-sha256",
}

// commandLine is the router's command line as the fixture writes it, without the program.
func (a routerArgs) commandLine(port, promPort int) []string {
	policy := a.policy
	if policy == "" {
		policy = "round_robin"
	}
	cmd := []string{"--host", "127.0.0.1", "--port", strconv.Itoa(port), "--policy", policy,
		"--prometheus-port", strconv.Itoa(promPort), "--prometheus-host", "127.0.0.1"}
	if len(a.workerURLs) > 0 {
		cmd = append(append(cmd, "--worker-urls"), a.workerURLs...)
	}
	if a.pd {
		cmd = append(cmd, "--vllm-pd-disaggregation")
		for _, p := range a.prefill {
			port := p.bootstrapPort
			if port == "" {
				port = "none"
			}
			cmd = append(cmd, "--prefill", p.url, port)
		}
		for _, u := range a.decode {
			cmd = append(cmd, "--decode", u)
		}
		if a.prefillPolicy != "" {
			cmd = append(cmd, "--prefill-policy", a.prefillPolicy)
		}
		if a.decodePolicy != "" {
			cmd = append(cmd, "--decode-policy", a.decodePolicy)
		}
	}
	for _, e := range a.extra {
		flag, ok := fixtureFlags[e.key]
		if !ok {
			continue
		}
		switch v := e.value.(type) {
		case bool:
			if v {
				cmd = append(cmd, flag)
			}
		default:
			cmd = append(cmd, flag, fmt.Sprint(v))
		}
	}
	return append(cmd, a.own...)
}

// router is a router started from a command line, serving until the test ends.
type router struct {
	url  string
	args []string
	logs *testkit.SyncBuffer
}

// startRouter runs the router with a's command line and waits, as the fixture does, until its
// /health answers 200.
func startRouter(t *testing.T, a routerArgs) *router {
	t.Helper()
	port := testkit.FreePort(t)
	args := a.commandLine(port, testkit.FreePort(t))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}) // closed when the router has stopped, runErr set
	var runErr error
	logs := &testkit.SyncBuffer{}
	go func() {
		defer close(done)
		runErr = cli.Execute(ctx, args, logs, logs)
	}()
	r := &router{url: "http://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(port)), args: args, logs: logs}
	t.Cleanup(func() {
		client.CloseIdleConnections() // the router's shutdown would otherwise close them
		cancel()
		select {
		case <-done:
		case <-time.After(40 * time.Second):
			t.Errorf("the router did not stop\n%s", logs)
		}
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(r.url + "/health")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return r
			}
		}
		select {
		case <-done:
			t.Fatalf("the router stopped: %v\ncommand line: %q\n%s", runErr, args, logs)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("the router did not become healthy: %v\ncommand line: %q\n%s", err, args, logs)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// answer is one answer as the tests read it.
type answer struct {
	status int
	header http.Header
	body   map[string]any
	err    error // the request failed without an answer (the tests count it as 599, as the fixture)
}

// workerID is the worker that answered, as the vLLM router's tests read it.
func (a answer) workerID() string {
	if id := a.header.Get("X-Worker-Id"); id != "" {
		return id
	}
	id, _ := a.body["worker_id"].(string)
	return id
}

// client sends the tests' requests; a request gets at most 30 s, as an upper bound on behaviour.
var client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

// post sends body as JSON to url.
func post(url string, body any) answer {
	b, _ := json.Marshal(body)
	resp, err := client.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		return answer{status: 599, err: err}
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := answer{status: resp.StatusCode, header: resp.Header}
	_ = json.Unmarshal(raw, &a.body)
	return a
}

// completion is the body of the tests' /v1/completions requests.
func completion(prompt string, maxTokens int) map[string]any {
	return map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": maxTokens, "stream": false}
}

// concurrently runs call(0) … call(n-1) on at most workers goroutines and returns the results in
// order, as the tests' thread pools do.
func concurrently[T any](n, workers int, call func(i int) T) []T {
	out := make([]T, n)
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				out[i] = call(i)
			}
		}()
	}
	for i := range n {
		next <- i
	}
	close(next)
	wg.Wait()
	return out
}
