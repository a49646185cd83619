package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// fakeWorker is an OpenAI-compatible worker on loopback whose behaviour each test sets.
type fakeWorker struct {
	t       *testing.T
	srv     *httptest.Server
	hits    atomic.Int64 // routed requests received
	healthy atomic.Bool
	models  []string

	mu         sync.Mutex
	handle     http.HandlerFunc // routed paths; default: a small JSON completion
	lastBody   []byte
	lastHeader http.Header
}

func newFakeWorker(t *testing.T, models ...string) *fakeWorker {
	t.Helper()
	if len(models) == 0 {
		models = []string{"test-model"}
	}
	f := &fakeWorker{t: t, models: models}
	f.healthy.Store(true)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		if !f.healthy.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.HandleFunc("GET /v1/models", func(w http.ResponseWriter, r *http.Request) {
		data := []map[string]string{}
		for _, m := range f.models {
			data = append(data, map[string]string{"id": m, "object": "model"})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": data})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		f.hits.Add(1)
		f.mu.Lock()
		f.lastBody, f.lastHeader = body, r.Header.Clone()
		h := f.handle
		f.mu.Unlock()
		if h == nil {
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("X-Worker-Custom", "yes")
			_, _ = io.WriteString(w, `{"id":"cmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hello"},"finish_reason":"stop"}]}`)
			return
		}
		h(w, r)
	})
	f.srv = httptest.NewServer(mux)
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeWorker) URL() string { return f.srv.URL }

func (f *fakeWorker) setHandler(h http.HandlerFunc) {
	f.mu.Lock()
	f.handle = h
	f.mu.Unlock()
}

func (f *fakeWorker) last() ([]byte, http.Header) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lastBody, f.lastHeader
}

// testConfig is a configuration for tests: no background health loop to speak of, quick retries,
// no separate metrics listener.
func testConfig() config.Config {
	c := config.Default()
	c.Policy = "round_robin"
	c.HealthCheckIntervalSecs = 3600 // tests drive health checks with CheckHealth
	c.HealthCheckTimeoutSecs = 2
	c.RetryInitialBackoffMs = 1
	c.RetryMaxBackoffMs = 5
	c.PrometheusPort = 0
	c.ShutdownGraceSecs = 10
	return c
}

// streamUntilCanceled makes the worker answer with one event of a stream and then hold the
// request until it is canceled (for at most 10 s); the channel it returns is closed at the
// cancellation.
func (w *fakeWorker) streamUntilCanceled() <-chan struct{} {
	canceled := make(chan struct{})
	w.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(rw, "data: {\"n\":1}\n\n")
		rw.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
			close(canceled)
		case <-time.After(10 * time.Second):
		}
	})
	return canceled
}

// testRouter is a router serving on a loopback port.
type testRouter struct {
	*Router
	url    string
	cancel context.CancelFunc
	done   chan error
}

// startRouter serves a router built from cfg and registers the workers in order (so positional
// policies such as round_robin are deterministic).
func startRouter(t *testing.T, cfg config.Config, ws ...*fakeWorker) *testRouter {
	t.Helper()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	r, err := New(cfg, log)
	if err != nil {
		t.Fatal(err)
	}
	ln := testkit.Listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	tr := &testRouter{Router: r, url: "http://" + ln.Addr().String(), cancel: cancel}
	addWorkers(t, ctx, r, ws)
	tr.done = testkit.Go(t, cancel, func() error { return r.Serve(ctx, ln, nil) })
	return tr
}

// addWorkers registers the workers with r in order.
func addWorkers(t *testing.T, ctx context.Context, r *Router, ws []*fakeWorker) {
	t.Helper()
	for _, w := range ws {
		if err := r.AddWorker(ctx, w.URL()); err != nil {
			t.Fatal(err)
		}
	}
}

func (tr *testRouter) post(t *testing.T, path, body string, header ...string) *http.Response {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, tr.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	maps.Copy(req.Header, testkit.Header(header...))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func readAll(t *testing.T, resp *http.Response) string {
	t.Helper()
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// withKey sends a body-less request presenting key as a bearer token (none when key is empty),
// and returns the answer's status and body.
func (tr *testRouter) withKey(t *testing.T, method, path, key string) (int, string) {
	t.Helper()
	var header []string
	if key != "" {
		header = []string{"Authorization", "Bearer " + key}
	}
	code, _, body := testkit.Send(t, nil, method, tr.url+path, "", header...)
	return code, body
}

// chatWithKey sends a small chat presenting key as a bearer token and returns the answer's
// status: whether the client keys let that key through, and within its tenant's limits.
func (tr *testRouter) chatWithKey(t *testing.T, key string) int {
	t.Helper()
	resp := tr.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, "Authorization", "Bearer "+key)
	readAll(t, resp)
	return resp.StatusCode
}

// clientKeysFile writes lines as a client API keys file (--client-api-keys-file) in a fresh
// temporary folder and returns its path.
func clientKeysFile(t testing.TB, lines string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "keys")
	writeClientKeys(t, path, lines)
	return path
}

// writeClientKeys replaces the content of the keys file at path with lines, as an operator's
// edit before a reload does.
func writeClientKeys(t testing.TB, path, lines string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
}

func (tr *testRouter) totalLoad() int64 {
	var n int64
	for _, w := range tr.Pool().All() {
		n += w.Load()
	}
	return n
}
