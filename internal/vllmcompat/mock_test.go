package vllmcompat

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// mockWorker is a worker in the style of the vLLM router's test fixture: it lists the model
// "mock" (the requests name others), answers /generate, /v1/completions and /v1/chat/completions
// with its id in the X-Worker-Id header and the body's worker_id, and can be slowed, failed or
// held. It also reports its requests in flight on /metrics under vLLM's gauge, as an engine does,
// and answers a prefill leg (kv_transfer_params with do_remote_decode) with the parameters of a
// transfer, as vLLM's NIXL connector does.
type mockWorker struct {
	*httptest.Server
	id       string
	opts     mockOptions
	inFlight atomic.Int64
	failed   atomic.Int64

	mu       sync.Mutex
	captured []captured
}

// mockOptions are the fixture's knobs.
type mockOptions struct {
	latency    time.Duration // before each answer
	failFirstN int           // the first N requests get 500
	stream     bool          // answer with two SSE chunks and [DONE]
	// hold, when set, keeps every inference request until it is closed (or the client leaves).
	hold <-chan struct{}
}

// captured is one inference request as the worker got it.
type captured struct {
	Path    string
	Headers http.Header
	Body    map[string]any
}

func newMockWorker(t *testing.T, opts mockOptions) *mockWorker {
	t.Helper()
	m := &mockWorker{opts: opts}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /health_generate", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("POST /flush_cache", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok") })
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]any{"object": "list", "data": []map[string]string{{"id": "mock", "object": "model"}}})
	})
	mux.HandleFunc("GET /get_model_info", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]any{"model": "mock", "vocab_size": 32000})
	})
	mux.HandleFunc("GET /get_server_info", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]any{"worker_id": m.id, "load_in_flight": m.inFlight.Load()})
	})
	mux.HandleFunc("GET /load", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, map[string]any{"server_load": m.inFlight.Load()})
	})
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprintf(w, "vllm:num_requests_running{model_name=\"mock\"} %d\nvllm:num_requests_waiting{model_name=\"mock\"} 0\n", m.inFlight.Load())
	})
	mux.HandleFunc("GET /captured_requests", func(w http.ResponseWriter, _ *http.Request) {
		m.mu.Lock()
		defer m.mu.Unlock()
		writeJSON(w, m.captured)
	})
	for _, path := range []string{"/generate", "/v1/completions", "/v1/chat/completions"} {
		mux.HandleFunc("POST "+path, m.infer)
	}
	// Any other path answers what it was asked, so that the tests can tell a forwarded request.
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		m.capture(r, body)
		w.Header().Set("X-Worker-Id", m.id)
		writeJSON(w, map[string]any{"worker_id": m.id, "method": r.Method, "path": r.URL.Path})
	})
	m.Server = httptest.NewServer(mux)
	m.id = "worker-" + m.Listener.Addr().String()[strings.LastIndexByte(m.Listener.Addr().String(), ':')+1:]
	t.Cleanup(m.Close)
	return m
}

// infer answers an inference request as the fixture does.
func (m *mockWorker) infer(w http.ResponseWriter, r *http.Request) {
	m.inFlight.Add(1)
	defer m.inFlight.Add(-1)
	raw, _ := io.ReadAll(r.Body)
	req := m.capture(r, raw)
	if m.opts.hold != nil {
		select {
		case <-m.opts.hold:
		case <-r.Context().Done():
			return
		}
	}
	if m.opts.latency > 0 {
		select {
		case <-time.After(m.opts.latency):
		case <-r.Context().Done():
			return
		}
	}
	w.Header().Set("X-Worker-Id", m.id)
	if m.failed.Add(1) <= int64(m.opts.failFirstN) {
		w.WriteHeader(http.StatusInternalServerError)
		writeJSON(w, map[string]any{"error": "mock failure 500"})
		return
	}
	if m.opts.stream {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 2 {
			fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}],\"worker_id\":%q}\n\n", m.id)
			w.(http.Flusher).Flush()
		}
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		return
	}
	answer := map[string]any{
		"id": fmt.Sprintf("cmpl-%d", time.Now().UnixNano()), "object": "text_completion", "model": "mock",
		"choices":   []map[string]any{{"text": "ok", "index": 0, "finish_reason": "stop"}},
		"worker_id": m.id,
	}
	if params, ok := req["kv_transfer_params"].(map[string]any); ok && params["do_remote_decode"] == true {
		answer["kv_transfer_params"] = map[string]any{
			"do_remote_prefill": true, "do_remote_decode": false, "remote_engine_id": m.id,
			"remote_block_ids": []int{1, 2}, "remote_host": "127.0.0.1", "remote_port": 5600,
		}
	}
	writeJSON(w, answer)
}

// capture records a request and returns its JSON body (nil when it has none).
func (m *mockWorker) capture(r *http.Request, raw []byte) map[string]any {
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	m.mu.Lock()
	m.captured = append(m.captured, captured{Path: r.URL.Path, Headers: r.Header.Clone(), Body: body})
	m.mu.Unlock()
	return body
}

// requests returns what the worker captured, as GET /captured_requests does.
func (m *mockWorker) requests() []captured {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]captured(nil), m.captured...)
}

// mockWorkers starts n workers with opts and returns them, their URLs and their ids, as the
// fixture's factory does.
func mockWorkers(t *testing.T, n int, opts mockOptions) (ws []*mockWorker, urls, ids []string) {
	t.Helper()
	for range n {
		w := newMockWorker(t, opts)
		ws, urls, ids = append(ws, w), append(urls, w.URL), append(ids, w.id)
	}
	return ws, urls, ids
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
