package tokenize

import (
	"encoding/json"
	"hash/crc32"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// engine is a loopback /tokenize that answers one token per message it was asked (a checksum
// of the message), and counts its calls; hold, when set, keeps each answer until it is closed.
// A counting engine starts each answer with the number of messages, so that no prompt's tokens
// begin with a shorter prompt's.
type engine struct {
	*httptest.Server
	calls    atomic.Int32
	asked    atomic.Value // the last model asked
	counting bool
}

func newEngine(t *testing.T, hold chan struct{}) *engine {
	e := &engine{}
	e.Server = newTokenizer(e, hold)
	t.Cleanup(e.Close)
	return e
}

func newTokenizer(e *engine, hold chan struct{}) *httptest.Server {
	return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			return
		case "/v1/models":
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m"}]}`)
			return
		}
		e.calls.Add(1)
		var q struct {
			Model    string            `json:"model"`
			Messages []json.RawMessage `json:"messages"`
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
		var tokens []uint32
		if e.counting {
			tokens = append(tokens, uint32(len(q.Messages)))
		}
		for _, m := range q.Messages {
			tokens = append(tokens, crc32.ChecksumIEEE(m))
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"tokens": tokens})
	}))
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

func (chatQuery) AppendTokenizeBody(dst, body []byte, model string) ([]byte, bool) {
	ask, err := json.Marshal(struct {
		Model    string          `json:"model"`
		Messages json.RawMessage `json:"messages"`
	}{model, body})
	return append(dst, ask...), err == nil
}

var chat chatQuery

// A prompt asked once is remembered: asking it again costs no call.
func TestTokensOfARepeatedPromptAreAskedOnce(t *testing.T) {
	e := newEngine(t, nil)
	c, ws, m := fleet(t, Options{}, e.URL)
	body := []byte(`[{"role":"user","content":"hi"}]`)
	for range 3 {
		ts, lora := c.Tokens("/v1/chat/completions", "hi", ws, "m", body, chat)
		if len(ts) != 1 || lora != "" {
			t.Fatalf("tokens %d, adapter %q; want 1, none", len(ts), lora)
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
	if ts, _ := c.Tokens("/v1/chat/completions", "hi", ws, "", []byte(`[{"role":"user","content":"hi"}]`), chat); ts == nil {
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
	if remembered(c, "/v1/chat/completions", "m", "hi") {
		t.Error("a timed-out call was remembered")
	}
}

// remembered says whether c holds the answer for text on scope, asked of model.
func remembered(c *Client, scope, model, text string) bool {
	key, _ := c.cache.keys(scope, model, text)
	_, ok := c.cache.get(key)
	return ok
}

// Three turns of one conversation: their history keys (each the one before plus the messages it
// appended) and their bodies.
var turns = []struct{ text, body string }{
	{"uhi\xff.", `[{"role":"user","content":"hi"}]`},
	{"uhi\xff.aok\xff.uthen\xff.", `[{"role":"user","content":"hi"},{"role":"assistant","content":"ok"},{"role":"user","content":"then"}]`},
	{"uhi\xff.aok\xff.uthen\xff.adone\xff.umore\xff.", `[{"role":"user","content":"hi"},{"role":"assistant","content":"ok"},{"role":"user","content":"then"},{"role":"assistant","content":"done"},{"role":"user","content":"more"}]`},
}

// waitRemembered waits until c holds the answer for text.
func waitRemembered(t *testing.T, c *Client, text string) {
	t.Helper()
	testkit.WaitFor(t, "the answer for "+text, func() bool { return remembered(c, "/v1/chat/completions", "m", text) })
}

// A turn whose earlier turn was tokenized gets the earlier turn's tokens without a call on its
// path; its own are asked in the background, and are what its next turn starts from.
func TestATurnStartsFromItsEarlierTurnsTokens(t *testing.T) {
	e := newEngine(t, nil)
	c, ws, m := fleet(t, Options{}, e.URL)
	first, _ := c.Tokens("/v1/chat/completions", turns[0].text, ws, "m", []byte(turns[0].body), chat)
	if len(first) != 1 {
		t.Fatalf("first turn: %d tokens, want 1", len(first))
	}
	second, _ := c.Tokens("/v1/chat/completions", turns[1].text, ws, "m", []byte(turns[1].body), chat)
	if !slices.Equal(second, first) {
		t.Fatalf("second turn got %v, want the first turn's %v", second, first)
	}
	waitRemembered(t, c, turns[1].text)
	third, _ := c.Tokens("/v1/chat/completions", turns[2].text, ws, "m", []byte(turns[2].body), chat)
	if len(third) != 3 || third[0] != first[0] {
		t.Fatalf("third turn got %v, want the second turn's 3 tokens, starting with %v", third, first)
	}
	waitRemembered(t, c, turns[2].text)
	if n := e.calls.Load(); n != 3 {
		t.Errorf("%d calls for three turns, want 3 (one on a request's path)", n)
	}
	if n := testutil.ToFloat64(m.TokenizeRequests.WithLabelValues(metrics.TokenizePrefix)); n != 2 {
		t.Errorf("tokenize_requests_total{result=prefix} = %v, want 2", n)
	}
}

// An engine whose prompts do not begin with their earlier turn's tokens is caught by the
// background answer: the model's later turns are asked in full, on their path.
func TestAnEngineWhosePromptsDoNotExtendIsAskedInFull(t *testing.T) {
	e := &engine{counting: true}
	e.Server = newTokenizer(e, nil)
	t.Cleanup(e.Close)
	c, ws, m := fleet(t, Options{}, e.URL)
	c.Tokens("/v1/chat/completions", turns[0].text, ws, "m", []byte(turns[0].body), chat)
	c.Tokens("/v1/chat/completions", turns[1].text, ws, "m", []byte(turns[1].body), chat)
	mismatches := m.TokenizeRequests.WithLabelValues(metrics.TokenizePrefixMismatch)
	testkit.WaitFor(t, "the background answer checked", func() bool { return testutil.ToFloat64(mismatches) > 0 })
	third, _ := c.Tokens("/v1/chat/completions", turns[2].text, ws, "m", []byte(turns[2].body), chat)
	if len(third) != 6 || third[0] != 5 {
		t.Errorf("third turn got %v, want its own 6 tokens, asked in full", third)
	}
	if remembered(c, "/v1/chat/completions", "m", turns[1].text) {
		t.Error("an answer that contradicted its earlier turn was remembered")
	}
}
