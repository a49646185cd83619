package router

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

const chatBody = `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`

func TestNonStreamingResponsePassesThroughWithRouterHeaders(t *testing.T) {
	w := newFakeWorker(t)
	tr := startRouter(t, testConfig(), w)
	odd := "{ \"messages\" : [{\"content\":\"hi\",\"role\":\"user\"}],   \"model\":\"test-model\" }"
	resp := tr.post(t, "/v1/chat/completions", odd,
		"X-Request-Id", "req-42", "X-Custom", "kept", "Connection", "X-Hop", "X-Hop", "dropped")
	body := readAll(t, resp)
	if resp.StatusCode != 200 || !strings.Contains(body, `"content":"hello"`) {
		t.Fatalf("status %d body %s", resp.StatusCode, body)
	}
	for name, want := range map[string]string{
		proxy.HeaderWorker: w.URL(), proxy.HeaderBaseWorker: w.URL(), proxy.HeaderDecision: "round_robin",
		proxy.HeaderRequestID: "req-42", "X-Worker-Custom": "yes",
	} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("header %s = %q, want %q", name, got, want)
		}
	}
	if resp.Header.Get(proxy.HeaderDPRank) != "" {
		t.Errorf("dp rank header set without data parallelism")
	}
	gotBody, gotHeader := w.last()
	if string(gotBody) != odd {
		t.Errorf("worker got body %q, want the client's bytes %q", gotBody, odd)
	}
	if gotHeader.Get("X-Custom") != "kept" || gotHeader.Get("X-Hop") != "" || gotHeader.Get("X-Request-Id") != "req-42" {
		t.Errorf("worker headers: X-Custom=%q X-Hop=%q X-Request-Id=%q", gotHeader.Get("X-Custom"), gotHeader.Get("X-Hop"), gotHeader.Get("X-Request-Id"))
	}
}

func TestRequestIDIsGeneratedWhenAbsent(t *testing.T) {
	w := newFakeWorker(t)
	tr := startRouter(t, testConfig(), w)
	resp := tr.post(t, "/v1/chat/completions", chatBody)
	readAll(t, resp)
	rid := resp.Header.Get(proxy.HeaderRequestID)
	_, h := w.last()
	if len(rid) < 16 || h.Get("X-Request-Id") != rid {
		t.Fatalf("request id %q, worker saw %q", rid, h.Get("X-Request-Id"))
	}
}

func TestStreamArrivesEventByEvent(t *testing.T) {
	w := newFakeWorker(t)
	release := make(chan struct{})
	w.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		fl := rw.(http.Flusher)
		fmt.Fprint(rw, "data: {\"n\":1}\n\n")
		fl.Flush()
		select { // the last event waits until the client has seen the first
		case <-release:
		case <-time.After(5 * time.Second):
			t.Error("the client never saw the first event while the worker held back the last")
		}
		fmt.Fprint(rw, "data: {\"n\":2}\n\ndata: [DONE]\n\n")
	})
	tr := startRouter(t, testConfig(), w)
	resp := tr.post(t, "/v1/chat/completions", `{"model":"test-model","stream":true,"messages":[{"role":"user","content":"hi"}]}`)
	defer resp.Body.Close()
	if resp.Header.Get(proxy.HeaderWorker) != w.URL() || resp.Header.Get(proxy.HeaderDecision) == "" {
		t.Fatalf("stream lacks router headers: %v", resp.Header)
	}
	rd := bufio.NewReader(resp.Body)
	first, err := rd.ReadString('\n')
	if err != nil || first != "data: {\"n\":1}\n" {
		t.Fatalf("first event %q, %v", first, err)
	}
	close(release) // only now may the worker send the rest
	rest, _ := io.ReadAll(rd)
	if !strings.Contains(string(rest), `{"n":2}`) || !strings.HasSuffix(string(rest), "data: [DONE]\n\n") {
		t.Fatalf("rest of stream %q", rest)
	}
	testkit.WaitFor(t, "load to return to zero", func() bool { return tr.totalLoad() == 0 })
}

// A request goes to the workers of its model; with --strict-model-matching a model no worker
// lists is refused, naming the served ones.
func TestModelRoutingAndUnknownModelWhenStrict(t *testing.T) {
	a := newFakeWorker(t, "model-a")
	b := newFakeWorker(t, "model-b")
	cfg := testConfig()
	cfg.StrictModelMatching = true
	tr := startRouter(t, cfg, a, b)
	for range 4 {
		readAll(t, tr.post(t, "/v1/chat/completions", `{"model":"model-b","messages":[{"role":"user","content":"x"}]}`))
	}
	if a.hits.Load() != 0 || b.hits.Load() != 4 {
		t.Fatalf("model-b requests: a got %d, b got %d", a.hits.Load(), b.hits.Load())
	}
	resp := tr.post(t, "/v1/chat/completions", `{"model":"model-c","messages":[]}`)
	body := readAll(t, resp)
	var e struct {
		Error struct{ Message, Code string }
	}
	_ = json.Unmarshal([]byte(body), &e)
	if resp.StatusCode != 404 || e.Error.Code != "model_not_found" || !strings.Contains(e.Error.Message, "model-a, model-b") {
		t.Fatalf("unknown model: %d %s", resp.StatusCode, body)
	}
	models := readAll(t, mustGet(t, tr.url+"/v1/models"))
	if !strings.Contains(models, `"model-a"`) || !strings.Contains(models, `"model-b"`) || !strings.Contains(models, `"object": "list"`) {
		t.Fatalf("/v1/models = %s", models)
	}
}

func TestModelNoWorkerServesIs404AndLeavesNoStateWhenStrict(t *testing.T) {
	w := newFakeWorker(t, "only")
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.StrictModelMatching = true
	tr := startRouter(t, cfg, w)
	for i := range 200 {
		body := fmt.Sprintf(`{"model":"bogus-%d","messages":[{"role":"user","content":"x"}]}`, i)
		resp := tr.post(t, "/v1/chat/completions", body, "x-session-id", fmt.Sprint(i))
		if got := readAll(t, resp); resp.StatusCode != 404 || !strings.Contains(got, "model_not_found") {
			t.Fatalf("unserved model: %d %s", resp.StatusCode, got)
		}
	}
	if w.hits.Load() != 0 {
		t.Fatalf("requests for unserved models reached the worker: %d", w.hits.Load())
	}
	// The served model, and no model at all, are routed and keyed under the served name.
	for _, body := range []string{`{"model":"only","messages":[{"role":"user","content":"x"}]}`, `{"messages":[{"role":"user","content":"y"}]}`} {
		if resp := tr.post(t, "/v1/chat/completions", body, "x-session-id", "s"); resp.StatusCode != 200 {
			t.Fatalf("served model: %d %s", resp.StatusCode, readAll(t, resp))
		} else {
			readAll(t, resp)
		}
	}
	metrics := readAll(t, mustGet(t, tr.url+"/metrics"))
	if strings.Contains(metrics, "bogus") {
		t.Fatal("an unserved model name reached the metrics")
	}
	if !strings.Contains(metrics, `vllm_router_cache_aware_sessions{model="only"} 1`) {
		t.Fatalf("sessions are not keyed under the served model:\n%s", grepLines(metrics, "cache_aware_sessions"))
	}
}

// By default a model no worker lists is forwarded, as the vLLM router forwards it: the workers
// answer for themselves. Whatever names clients send, they leave no per-name state behind: no
// metric series, sessions kept under no model, admission counts under none; with a per-worker
// limit such requests are admitted by the room of every available worker.
func TestModelNoWorkerListsIsForwardedAndLeavesNoPerNameState(t *testing.T) {
	a, b := newFakeWorker(t, "only"), newFakeWorker(t, "only")
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.MaxInflightPerWorker = 1
	tr := startRouter(t, cfg, a, b)
	const names = 200
	for i := range names {
		body := fmt.Sprintf(`{"model":"bogus-%d","messages":[{"role":"user","content":"x %d"}]}`, i, i)
		resp := tr.post(t, "/v1/chat/completions", body, "x-session-id", fmt.Sprint(i))
		if got := readAll(t, resp); resp.StatusCode != 200 {
			t.Fatalf("model no worker lists: %d %s", resp.StatusCode, got)
		}
	}
	if a.hits.Load()+b.hits.Load() != names || a.hits.Load() == 0 || b.hits.Load() == 0 {
		t.Fatalf("the workers got %d and %d of %d requests, want all of them, on both", a.hits.Load(), b.hits.Load(), names)
	}
	metrics := readAll(t, mustGet(t, tr.url+"/metrics"))
	if strings.Contains(metrics, "bogus") {
		t.Fatalf("a forwarded model name reached the metrics:\n%s", grepLines(metrics, "bogus"))
	}
	if got := grepLines(metrics, "vllm_router_cache_aware_sessions{"); got != fmt.Sprintf(`vllm_router_cache_aware_sessions{model="%s"} %d`, cacheaware.DefaultModel, names) {
		t.Fatalf("sessions of forwarded names are not kept under no model:\n%s", got)
	}
	if c := tr.admission.Controller; c.InFlight() != 0 || c.Queued() != 0 {
		t.Fatalf("admission: %d in flight, %d queued after every request ended", c.InFlight(), c.Queued())
	}
}

// grepLines returns the lines of text that contain s.
func grepLines(text, s string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, s) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

func TestFailingWorkerLeavesWithinThresholdAndReturnsAfterRecovery(t *testing.T) {
	cfg := testConfig()
	cfg.HealthFailureThreshold, cfg.HealthSuccessThreshold = 3, 2
	a, b := newFakeWorker(t), newFakeWorker(t)
	tr := startRouter(t, cfg, a, b)
	ctx := context.Background()
	a.healthy.Store(false)
	for i := 1; i <= 3; i++ {
		tr.CheckHealth(ctx)
		if got := tr.Pool().Get(a.URL())[0].Healthy(); got != (i < 3) {
			t.Fatalf("after %d failed checks healthy=%v", i, got)
		}
	}
	a.hits.Store(0)
	for range 6 {
		readAll(t, tr.post(t, "/v1/chat/completions", chatBody))
	}
	if a.hits.Load() != 0 {
		t.Fatalf("unhealthy worker got %d requests", a.hits.Load())
	}
	a.healthy.Store(true)
	tr.CheckHealth(ctx)
	if tr.Pool().Get(a.URL())[0].Healthy() {
		t.Fatal("healthy again after one passed check; threshold is 2")
	}
	tr.CheckHealth(ctx)
	if !tr.Pool().Get(a.URL())[0].Healthy() {
		t.Fatal("not healthy after two passed checks")
	}
	for range 6 {
		readAll(t, tr.post(t, "/v1/chat/completions", chatBody))
	}
	if a.hits.Load() == 0 {
		t.Fatal("recovered worker got no traffic")
	}
	health := mustGet(t, tr.url+"/health")
	if readAll(t, health); health.StatusCode != 200 {
		t.Fatalf("/health %d", health.StatusCode)
	}
}

func TestHealthIs503WhenNoWorkerIsHealthy(t *testing.T) {
	a := newFakeWorker(t)
	a.healthy.Store(false)
	tr := startRouter(t, testConfig(), a)
	for path, want := range map[string]int{"/health": 503, "/readiness": 503, "/liveness": 200} {
		resp := mustGet(t, tr.url+path)
		readAll(t, resp)
		if resp.StatusCode != want {
			t.Errorf("%s = %d, want %d", path, resp.StatusCode, want)
		}
	}
	resp := tr.post(t, "/v1/chat/completions", chatBody)
	readAll(t, resp)
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("no healthy worker: %d Retry-After=%q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

func TestRetryMovesRequestOffRefusedConnection(t *testing.T) {
	dead, live := newFakeWorker(t), newFakeWorker(t)
	tr := startRouter(t, testConfig(), dead, live)
	dead.srv.Close() // registered and healthy, now refusing connections
	for range 4 {
		resp := tr.post(t, "/v1/chat/completions", chatBody)
		if body := readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get(proxy.HeaderWorker) != live.URL() {
			t.Fatalf("status %d worker %q body %s", resp.StatusCode, resp.Header.Get(proxy.HeaderWorker), body)
		}
	}
	if got := testutil.ToFloat64(tr.Metrics().Retries); got < 1 {
		t.Fatalf("retries_total = %v", got)
	}
	if got := testutil.ToFloat64(tr.Metrics().UpstreamErrors.WithLabelValues("connect")); got < 1 {
		t.Fatalf("upstream_errors_total{kind=connect} = %v", got)
	}
}

func TestAllWorkersRefusingGives502(t *testing.T) {
	a := newFakeWorker(t)
	tr := startRouter(t, testConfig(), a)
	a.srv.Close()
	resp := tr.post(t, "/v1/chat/completions", chatBody)
	if body := readAll(t, resp); resp.StatusCode != 502 || !strings.Contains(body, "upstream_unavailable") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
}

func TestRetryOn503ThenPassThroughOfOtherErrors(t *testing.T) {
	busy, ok := newFakeWorker(t), newFakeWorker(t)
	busy.setHandler(func(rw http.ResponseWriter, r *http.Request) { rw.WriteHeader(503) })
	tr := startRouter(t, testConfig(), busy, ok)
	resp := tr.post(t, "/v1/chat/completions", chatBody)
	readAll(t, resp)
	if resp.StatusCode != 200 || busy.hits.Load() != 1 || ok.hits.Load() != 1 {
		t.Fatalf("status %d busy hits %d ok hits %d", resp.StatusCode, busy.hits.Load(), ok.hits.Load())
	}
	// A 400 or a 500 is the worker's real answer: passed through, not retried.
	ok.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		rw.WriteHeader(400)
		_, _ = io.WriteString(rw, `{"error":"bad"}`)
	})
	busy.setHandler(func(rw http.ResponseWriter, r *http.Request) { rw.WriteHeader(500) })
	before := busy.hits.Load() + ok.hits.Load()
	for range 2 {
		resp := tr.post(t, "/v1/chat/completions", chatBody)
		body := readAll(t, resp)
		if resp.StatusCode != 400 && resp.StatusCode != 500 {
			t.Fatalf("status %d body %s", resp.StatusCode, body)
		}
	}
	if got := busy.hits.Load() + ok.hits.Load() - before; got != 2 {
		t.Fatalf("two requests reached workers %d times", got)
	}
}

func TestNoRetryAfterFirstByte(t *testing.T) {
	broken, spare := newFakeWorker(t), newFakeWorker(t)
	broken.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(rw, "data: {\"n\":1}\n\n")
		rw.(http.Flusher).Flush()
		conn, _, err := rw.(http.Hijacker).Hijack()
		if err == nil {
			conn.Close() // the worker dies mid-stream
		}
	})
	tr := startRouter(t, testConfig(), broken, spare)
	resp := tr.post(t, "/v1/chat/completions", `{"stream":true,"messages":[{"role":"user","content":"x"}]}`)
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.Contains(string(body), `{"n":1}`) {
		t.Fatalf("status %d body %q", resp.StatusCode, body)
	}
	if err == nil {
		t.Fatal("a stream broken upstream ended cleanly for the client; it must be cut")
	}
	if spare.hits.Load() != 0 {
		t.Fatalf("request was retried after the first byte (%d hits on the spare)", spare.hits.Load())
	}
	if got := testutil.ToFloat64(tr.Metrics().UpstreamErrors.WithLabelValues("mid_stream")); got != 1 {
		t.Fatalf("upstream_errors_total{kind=mid_stream} = %v", got)
	}
	testkit.WaitFor(t, "load to return to zero", func() bool { return tr.totalLoad() == 0 })
}

func TestClientDisconnectCancelsUpstream(t *testing.T) {
	w := newFakeWorker(t)
	canceled := w.streamUntilCanceled()
	tr := startRouter(t, testConfig(), w)
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tr.url+"/v1/chat/completions", strings.NewReader(`{"stream":true,"messages":[]}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		t.Fatal(err)
	}
	if tr.totalLoad() != 1 {
		t.Fatalf("load during the stream = %d, want 1", tr.totalLoad())
	}
	cancel()
	resp.Body.Close()
	select {
	case <-canceled:
	case <-time.After(5 * time.Second):
		t.Fatal("upstream request not canceled after the client left")
	}
	testkit.WaitFor(t, "load to return to zero", func() bool { return tr.totalLoad() == 0 })
}

func TestLoadCountersReturnToZeroAfterMixedBurst(t *testing.T) {
	ok, flaky, streamer, slow := newFakeWorker(t), newFakeWorker(t), newFakeWorker(t), newFakeWorker(t)
	var n sync.Mutex
	count := 0
	flaky.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		n.Lock()
		count++
		c := count
		n.Unlock()
		switch c % 3 {
		case 0:
			rw.WriteHeader(503)
		case 1:
			rw.WriteHeader(500)
		default:
			if conn, _, err := rw.(http.Hijacker).Hijack(); err == nil {
				conn.Close()
			}
		}
	})
	streamer.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		for i := range 5 {
			fmt.Fprintf(rw, "data: {\"n\":%d}\n\n", i)
			rw.(http.Flusher).Flush()
			time.Sleep(time.Millisecond)
		}
		fmt.Fprint(rw, "data: [DONE]\n\n")
	})
	slow.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(200 * time.Millisecond):
			_, _ = io.WriteString(rw, `{}`)
		}
	})
	cfg := testConfig()
	cfg.Policy = "random"
	cfg.DisableCircuitBreaker = true
	tr := startRouter(t, cfg, ok, flaky, streamer, slow)
	var wg sync.WaitGroup
	for i := range 60 {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			if i%4 == 0 { // a client that gives up early
				go func() { time.Sleep(time.Duration(i%7) * time.Millisecond); cancel() }()
			}
			req, _ := http.NewRequestWithContext(ctx, http.MethodPost, tr.url+"/v1/chat/completions",
				strings.NewReader(fmt.Sprintf(`{"stream":%v,"messages":[{"role":"user","content":"%d"}]}`, i%2 == 0, i)))
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				_, _ = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	testkit.WaitFor(t, "every load counter back at zero", func() bool { return tr.totalLoad() == 0 })
	for _, w := range tr.Pool().All() {
		if w.Load() != 0 {
			t.Errorf("%s load %d", w.ID(), w.Load())
		}
	}
}

func TestBadRequestsNeverReachAWorker(t *testing.T) {
	w := newFakeWorker(t)
	cfg := testConfig()
	cfg.MaxPayloadSize = 1024
	cfg.RefuseUnknownPaths = true
	tr := startRouter(t, cfg, w)
	cases := []struct {
		name, path, body string
		status           int
		code             string
	}{
		{"malformed json", "/v1/chat/completions", `{"messages":[`, 400, "invalid_json"},
		{"not an object", "/v1/completions", `["a"]`, 400, "invalid_json"},
		{"oversized body", "/v1/chat/completions", `{"prompt":"` + strings.Repeat("x", 2000) + `"}`, 413, "payload_too_large"},
		{"unknown route", "/v1/unknown", `{}`, 404, "not_found"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			resp := tr.post(t, c.path, c.body)
			body := readAll(t, resp)
			var e struct {
				Error struct{ Message, Type, Code string }
			}
			if err := json.Unmarshal([]byte(body), &e); err != nil || e.Error.Message == "" {
				t.Fatalf("not an OpenAI error body: %s", body)
			}
			if resp.StatusCode != c.status || e.Error.Code != c.code {
				t.Fatalf("got %d %q, want %d %q", resp.StatusCode, e.Error.Code, c.status, c.code)
			}
		})
	}
	resp := mustGet(t, tr.url+"/v1/chat/completions")
	if readAll(t, resp); resp.StatusCode != 405 {
		t.Errorf("GET on a POST route = %d, want 405", resp.StatusCode)
	}
	if w.hits.Load() != 0 {
		t.Fatalf("worker contacted %d times by bad requests", w.hits.Load())
	}
}

func TestUpstreamTimeoutGives504(t *testing.T) {
	w := newFakeWorker(t)
	w.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	})
	cfg := testConfig()
	cfg.RequestTimeoutSecs = 0.2
	cfg.FirstByteTimeoutSecs = 0
	tr := startRouter(t, cfg, w)
	resp := tr.post(t, "/v1/chat/completions", chatBody)
	if body := readAll(t, resp); resp.StatusCode != 504 || !strings.Contains(body, "upstream_timeout") {
		t.Fatalf("%d %s", resp.StatusCode, body)
	}
	if w.hits.Load() != 1 {
		t.Fatalf("timed-out request was retried: %d hits", w.hits.Load())
	}
}

func TestDataParallelRanksAreTenants(t *testing.T) {
	w := newFakeWorker(t)
	cfg := testConfig()
	cfg.DPSize = 2
	tr := startRouter(t, cfg, w)
	seen := map[string]bool{}
	for range 4 {
		resp := tr.post(t, "/v1/chat/completions", chatBody)
		readAll(t, resp)
		_, h := w.last()
		rank := resp.Header.Get(proxy.HeaderDPRank)
		if h.Get("X-Data-Parallel-Rank") != rank || resp.Header.Get(proxy.HeaderWorker) != w.URL()+"@"+rank {
			t.Fatalf("rank header %q, worker saw %q, tenant %q", rank, h.Get("X-Data-Parallel-Rank"), resp.Header.Get(proxy.HeaderWorker))
		}
		seen[rank] = true
	}
	if !seen["0"] || !seen["1"] {
		t.Fatalf("round robin over two ranks used %v", seen)
	}
}

func TestAPIKeyIsAddedOnlyWhenClientSentNone(t *testing.T) {
	w := newFakeWorker(t)
	cfg := testConfig()
	cfg.APIKey = "worker-secret"
	tr := startRouter(t, cfg, w)
	readAll(t, tr.post(t, "/v1/chat/completions", chatBody))
	if _, h := w.last(); h.Get("Authorization") != "Bearer worker-secret" {
		t.Fatalf("Authorization = %q", h.Get("Authorization"))
	}
	readAll(t, tr.post(t, "/v1/chat/completions", chatBody, "Authorization", "Bearer client"))
	if _, h := w.last(); h.Get("Authorization") != "Bearer client" {
		t.Fatalf("client's Authorization replaced: %q", h.Get("Authorization"))
	}
}

func TestAdminEndpointsRequireKeyAndManageWorkers(t *testing.T) {
	a, b := newFakeWorker(t), newFakeWorker(t)
	cfg := testConfig()
	cfg.AdminAPIKey = "admin-secret"
	tr := startRouter(t, cfg, a)
	call := func(method, path, key string) (int, string) { return tr.withKey(t, method, path, key) }
	for _, key := range []string{"", "wrong"} {
		if code, _ := call("GET", "/list_workers", key); code != 401 {
			t.Fatalf("list_workers with key %q = %d, want 401", key, code)
		}
	}
	if code, body := call("POST", "/add_worker?url="+url.QueryEscape(b.URL()), "admin-secret"); code != 200 || !strings.Contains(body, `"healthy": true`) {
		t.Fatalf("add_worker: %d %s", code, body)
	}
	if code, _ := call("POST", "/add_worker?url="+url.QueryEscape(b.URL()), "admin-secret"); code != 409 {
		t.Fatalf("adding twice = %d, want 409", code)
	}
	// A worker that never answers stays listed, as unhealthy.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	deadURL := "http://" + ln.Addr().String()
	ln.Close()
	if code, body := call("POST", "/workers?url="+url.QueryEscape(deadURL), "admin-secret"); code != 200 || !strings.Contains(body, `"healthy": false`) {
		t.Fatalf("POST /workers dead: %d %s", code, body)
	}
	code, body := call("GET", "/workers", "admin-secret")
	if code != 200 || !strings.Contains(body, deadURL) || !strings.Contains(body, b.URL()) || !strings.Contains(body, `"circuit_breaker": "closed"`) {
		t.Fatalf("GET /workers: %d %s", code, body)
	}
	if code, body := call("GET", "/workers/"+url.PathEscape(b.URL()), "admin-secret"); code != 200 || !strings.Contains(body, b.URL()) {
		t.Fatalf("GET /workers/{url}: %d %s", code, body)
	}
	if code, _ := call("DELETE", "/workers/"+url.PathEscape(b.URL()), "admin-secret"); code != 200 {
		t.Fatalf("DELETE /workers/{url} = %d", code)
	}
	if code, _ := call("POST", "/remove_worker?url="+url.QueryEscape(deadURL), "admin-secret"); code != 200 {
		t.Fatalf("remove_worker = %d", code)
	}
	if code, _ := call("POST", "/remove_worker?url="+url.QueryEscape(deadURL), "admin-secret"); code != 404 {
		t.Fatalf("removing twice = %d, want 404", code)
	}
	if code, _ := call("POST", "/add_worker?url=not-a-url", "admin-secret"); code != 400 {
		t.Fatalf("malformed url = %d, want 400", code)
	}
	for range 4 {
		readAll(t, tr.post(t, "/v1/chat/completions", chatBody))
	}
	if b.hits.Load() != 0 || a.hits.Load() != 4 {
		t.Fatalf("after removal: a %d hits, b %d hits", a.hits.Load(), b.hits.Load())
	}
}

func TestGracefulDrainFinishesInFlightRequests(t *testing.T) {
	w := newFakeWorker(t)
	started, release := make(chan struct{}), make(chan struct{})
	w.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
		_, _ = io.WriteString(rw, `{"done":true}`)
	})
	tr := startRouter(t, testConfig(), w)
	result := make(chan string, 1)
	go func() {
		resp, err := http.Post(tr.url+"/v1/chat/completions", "application/json", strings.NewReader(chatBody))
		if err != nil {
			result <- err.Error()
			return
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		result <- fmt.Sprintf("%d %s", resp.StatusCode, b)
	}()
	<-started
	tr.cancel() // SIGTERM
	testkit.WaitFor(t, "the listener to close", func() bool {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(tr.url, "http://"), time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	close(release)
	if got := <-result; got != `200 {"done":true}` {
		t.Fatalf("in-flight request during drain: %s", got)
	}
	select {
	case err := <-tr.done:
		if err != nil {
			t.Fatalf("Serve after drain: %v", err)
		}
		tr.done <- nil // for the cleanup
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after the drain")
	}
}

func TestMetricsEndpointExposesRouterSeries(t *testing.T) {
	w := newFakeWorker(t)
	tr := startRouter(t, testConfig(), w)
	readAll(t, tr.post(t, "/v1/chat/completions", chatBody))
	body := readAll(t, mustGet(t, tr.url+"/metrics"))
	for _, want := range []string{
		`vllm_router_requests_total{route="/v1/chat/completions",status_class="2xx"} 1`,
		`vllm_router_processed_requests_total{worker="` + w.URL() + `"} 1`,
		`vllm_router_policy_decisions_total{policy="round_robin",worker="` + w.URL() + `"} 1`,
		`vllm_router_worker_healthy{worker="` + w.URL() + `"} 1`,
		`vllm_router_worker_load{worker="` + w.URL() + `"} 0`,
		`vllm_router_active_workers 1`,
		`vllm_router_request_duration_seconds_count{route="/v1/chat/completions"} 1`,
		`vllm_router_time_to_first_byte_seconds_count{route="/v1/chat/completions"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// The series the status page, the Grafana dashboard and the alert rules read exist, at 0, as soon
// as the router runs and its workers joined, before any request: the prompt and cached tokens
// under every decision label and the corrections of each worker, and every kind of eviction. A
// worker that leaves takes its series with it.
func TestMetricsTheDashboardsReadExistBeforeTheFirstRequest(t *testing.T) {
	a, b := newFakeWorker(t), newFakeWorker(t)
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	tr := startRouter(t, cfg, a, b)
	body := readAll(t, mustGet(t, tr.url+"/metrics"))
	var want []string
	for _, w := range []*fakeWorker{a, b} {
		worker := `worker="` + w.URL() + `"`
		want = append(want, `vllm_router_cache_aware_corrections_total{`+worker+`} 0`)
		for _, label := range tr.policy.Labels() {
			for _, name := range []string{"prompt_tokens_total", "cached_tokens_predicted_total", "cached_tokens_achieved_total"} {
				want = append(want, `vllm_router_`+name+`{decision="`+label+`",`+worker+`} 0`)
			}
		}
	}
	for _, kind := range []string{"tree", "session_ttl", "session_capacity", "worker_removed"} {
		want = append(want, `vllm_router_cache_aware_evictions_total{kind="`+kind+`"} 0`)
	}
	for _, line := range want {
		if !strings.Contains(body, "\n"+line+"\n") {
			t.Errorf("/metrics before any request lacks %s", line)
		}
	}
	if err := tr.RemoveWorker(a.URL()); err != nil {
		t.Fatal(err)
	}
	body = readAll(t, mustGet(t, tr.url+"/metrics"))
	if strings.Contains(body, `worker="`+a.URL()+`"`) {
		t.Errorf("the removed worker's series are still there")
	}
	if !strings.Contains(body, `vllm_router_prompt_tokens_total{decision="session_id_match",worker="`+b.URL()+`"} 0`) {
		t.Errorf("the other worker's series went too")
	}
}

func mustGet(t *testing.T, u string) *http.Response {
	t.Helper()
	resp, err := http.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// A worker that joins has its per-worker counters at 0 at once, before it serves anything.
func TestRouter_AddedWorkerHasItsCountersBeforeItsFirstRequest(t *testing.T) {
	w := newFakeWorker(t, "m")
	tr := startRouter(t, testConfig(), w)
	name := tr.Pool().Get(w.URL())[0].Name()
	if got := testutil.CollectAndCount(tr.Metrics().Processed); got != 1 {
		t.Fatalf("processed_requests_total has %d series, want 1", got)
	}
	if got := testutil.ToFloat64(tr.Metrics().PolicyDecisions.WithLabelValues("round_robin", name)); got != 0 {
		t.Errorf("policy_decisions_total = %v, want 0", got)
	}
}
