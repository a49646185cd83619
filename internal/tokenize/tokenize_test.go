package tokenize

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// engine is a loopback /tokenize that answers one token per byte of the messages it was asked,
// and counts its calls; hold, when set, keeps each answer until it is closed.
type engine struct {
	*httptest.Server
	calls atomic.Int32
	asked atomic.Value // the last model asked
}

func newEngine(t *testing.T, hold chan struct{}) *engine {
	e := &engine{}
	e.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m"}]}`)
			return
		}
		e.calls.Add(1)
		var q struct {
			Model    string          `json:"model"`
			Messages json.RawMessage `json:"messages"`
		}
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &q)
		e.asked.Store(q.Model)
		if hold != nil {
			select {
			case <-hold:
			case <-r.Context().Done():
			}
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": make([]uint32, len(q.Messages))})
	}))
	t.Cleanup(e.Close)
	return e
}

// fleet registers urls as workers, probed once (they list model "m"), and returns them with a
// client.
func fleet(t *testing.T, opts Options, urls ...string) (*Client, []*workers.Worker, *metrics.Metrics) {
	pool := workers.NewPool(workers.Options{})
	checker := workers.NewChecker(pool, workers.HealthOptions{Endpoint: "/health", Timeout: 5 * time.Second}, http.DefaultClient, slog.New(slog.DiscardHandler))
	for _, u := range urls {
		if _, err := pool.Add(u); err != nil {
			t.Fatal(err)
		}
		checker.Check(t.Context(), u)
	}
	for _, w := range pool.All() {
		if models := w.Models(); len(models) != 1 || models[0] != "m" {
			t.Fatalf("worker %s lists %v after its probe, want [m]", w.Name(), models)
		}
	}
	m := metrics.New(pool)
	opts.CacheBytes, opts.Metrics, opts.Log = 1<<20, m, slog.New(slog.DiscardHandler)
	if opts.Dialer.Timeouts.Tokenize == 0 {
		opts.Dialer.Timeouts = upstream.Timeouts{Dial: 2 * time.Second, Tokenize: 10 * time.Second}
	}
	return New(opts), pool.All(), m
}

// chatQuery renders a body of chat messages as the query asking model for their tokens.
type chatQuery struct{}

func (chatQuery) TokenizeBody(body []byte, model string) ([]byte, bool) {
	ask, err := json.Marshal(struct {
		Model    string          `json:"model"`
		Messages json.RawMessage `json:"messages"`
	}{model, body})
	return ask, err == nil
}

var chat chatQuery

// A prompt asked once is remembered: asking it again costs no call.
func TestTokensOfARepeatedPromptAreAskedOnce(t *testing.T) {
	e := newEngine(t, nil)
	c, ws, m := fleet(t, Options{}, e.URL)
	body := []byte(`[{"role":"user","content":"hi"}]`)
	for range 3 {
		ts, lora := c.Tokens("/v1/chat/completions", "hi", ws, "m", body, chat)
		if len(ts) != len(body) || lora != "" {
			t.Fatalf("tokens %d, adapter %q; want %d, none", len(ts), lora, len(body))
		}
	}
	if n := e.calls.Load(); n != 1 {
		t.Errorf("%d calls for one prompt asked three times, want 1", n)
	}
	if n := testutil.ToFloat64(m.TokenizeRequests.WithLabelValues(metrics.TokenizeCached)); n != 2 {
		t.Errorf("tokenize_requests_total{result=cached} = %v, want 2", n)
	}
}

// The render service, when set, is asked in place of the worker, for the worker's model.
func TestRenderServiceIsAskedInPlaceOfTheWorker(t *testing.T) {
	worker, render := newEngine(t, nil), newEngine(t, nil)
	c, ws, _ := fleet(t, Options{URL: render.URL}, worker.URL)
	if ts, _ := c.Tokens("/v1/chat/completions", "hi", ws, "", []byte(`[]`), chat); ts == nil {
		t.Fatal("no tokens")
	}
	if worker.calls.Load() != 0 || render.calls.Load() != 1 || render.asked.Load() != "m" {
		t.Errorf("worker asked %d times, render service %d times for %v; want 0, 1 for m", worker.calls.Load(), render.calls.Load(), render.asked.Load())
	}
}

// An engine that does not answer within the tokenize timeout leaves the request without tokens,
// counted as a timeout, and nothing is remembered.
func TestTokensPastTheTimeoutAreNotWaitedFor(t *testing.T) {
	hold := make(chan struct{})
	defer close(hold)
	e := newEngine(t, hold)
	c, ws, m := fleet(t, Options{Dialer: upstream.Dialer{Timeouts: upstream.Timeouts{Dial: 2 * time.Second, Tokenize: 50 * time.Millisecond}}}, e.URL)
	if ts, _ := c.Tokens("/v1/chat/completions", "hi", ws, "m", []byte(`[]`), chat); ts != nil {
		t.Fatalf("tokens %v from an engine that never answered", ts)
	}
	if n := testutil.ToFloat64(m.TokenizeRequests.WithLabelValues(metrics.TokenizeTimeout)); n != 1 {
		t.Errorf("tokenize_requests_total{result=timeout} = %v, want 1", n)
	}
	if _, ok := c.cache.get("/v1/chat/completions\x00m\x00hi"); ok {
		t.Error("a timed-out call was remembered")
	}
}
