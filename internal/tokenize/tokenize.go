// Package tokenize asks an engine for a request's prompt tokens, as it will render them: vLLM's
// POST /tokenize with a chat's messages and tools and add_generation_prompt, or a completion's
// prompt. A policy that matches requests against the engines' KV-cache events needs them; the
// policy says which requests are worth the round trip (policy.Policy.WantsTokens), the request
// renders its own query (Query: package protocol writes it), and this package does the rest: which worker to ask
// (workers.TokenizeOn: the least loaded candidate, and the model to ask it for), or the render
// service instead (--tokenize-url); the call, through the router's worker client and within
// upstream.Timeouts.TokenizeFor; the answers remembered by route, model and history key, so that
// a retried or repeated prompt is not tokenized twice; and the tokenize_* metrics.
//
// The wait is bounded by --tokenize-timeout-secs plus --tokenize-timeout-per-kib-ms for each KiB
// asked, after which the request routes as it would without events. An adapter's tokens are
// asked with the adapter's own name, so that the engine renders the request as it will serve it,
// and come back with it: engines key an adapter's blocks apart.
package tokenize

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Options configure a Client.
type Options struct {
	// CacheBytes bounds the remembered answers (their keys and tokens), all together.
	CacheBytes int
	// URL, when set, is the base URL of a render service asked in place of the least loaded
	// candidate (--tokenize-url).
	URL string
	// Dialer is the router's way to workers: its client makes the calls, its Timeouts bound them.
	Dialer  upstream.Dialer
	Metrics *metrics.Metrics
	Log     *slog.Logger
}

// Query renders a request's POST /tokenize body for the model the engine is asked for; ok is
// false when the request would not be rendered exactly as the engine will serve it, and is not
// tokenized. A request that package protocol read renders its own (protocol.Request), from its
// one parse of body.
type Query interface {
	TokenizeBody(body []byte, model string) (ask []byte, ok bool)
}

// maxAnswer bounds the answer read from /tokenize.
const maxAnswer = 8 << 20

// Client asks for prompt tokens and remembers the answers.
type Client struct {
	opts  Options
	http  *http.Client
	cache cache
}

// New returns a client with an empty cache.
func New(opts Options) *Client {
	return &Client{opts: opts, http: opts.Dialer.Client(), cache: cache{budget: opts.CacheBytes, byKey: map[string][]uint32{}}}
}

// Tokens returns the prompt tokens of a request for model (its routing text text, on the route
// scope) as the engine of its least loaded candidate renders them, and the LoRA adapter they are
// for ("" for a base model); nil when they are not to be had: no candidate lists the model as
// its first base model or as an adapter, q cannot render body exactly, or the call failed or
// timed out. q renders the query only when the answer is not remembered.
func (c *Client) Tokens(scope, text string, candidates []*workers.Worker, model string, body []byte, q Query) ([]uint32, string) {
	w, asked, lora, ok := workers.TokenizeOn(candidates, model)
	if !ok {
		return nil, ""
	}
	// The history keys of the three APIs share one framing, and their prompts may still render
	// apart (a Messages tool_use input is rewritten as Python writes JSON): the scope keeps them
	// apart.
	key := scope + "\x00" + asked + "\x00" + text
	if ts, ok := c.cache.get(key); ok {
		c.opts.Metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeCached).Inc()
		return ts, lora
	}
	ask, ok := q.TokenizeBody(body, asked)
	if !ok {
		return nil, "" // not rendered exactly: routed as without events
	}
	start := time.Now()
	ts, err := c.call(w, ask)
	c.opts.Metrics.TokenizeDuration.Observe(time.Since(start).Seconds())
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		c.opts.Metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeTimeout).Inc()
		return nil, ""
	case err != nil:
		c.opts.Metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeError).Inc()
		c.opts.Log.Debug("tokenize failed", "worker", w.Name(), "error", err)
		return nil, ""
	}
	c.opts.Metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeOK).Inc()
	c.cache.put(key, ts)
	return ts, lora
}

// call asks the render service (--tokenize-url), else w, for the tokens of the query ask.
func (c *Client) call(w *workers.Worker, ask []byte) ([]uint32, error) {
	base := w.URL()
	if c.opts.URL != "" {
		base = c.opts.URL
	}
	ctx, cancel := context.WithCancel(context.Background())
	if t := c.opts.Dialer.Timeouts.TokenizeFor(len(ask)); t > 0 {
		ctx, cancel = context.WithTimeout(ctx, t)
	}
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tokenize", bytes.NewReader(ask))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/tokenize answered %d", resp.StatusCode)
	}
	var answer struct {
		Tokens []uint32 `json:"tokens"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxAnswer)).Decode(&answer); err != nil {
		return nil, err
	}
	return answer.Tokens, nil
}

// cache remembers answers by key, oldest forgotten first.
type cache struct {
	mu     sync.Mutex
	budget int
	used   int
	byKey  map[string][]uint32
	order  []string
}

func (c *cache) get(key string) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ts, ok := c.byKey[key]
	return ts, ok
}

func (c *cache) put(key string, ts []uint32) {
	size := len(key) + 4*len(ts)
	if size > c.budget/4 {
		return // one answer may not take over the cache
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.byKey[key]; ok {
		return
	}
	for c.used+size > c.budget && len(c.order) > 0 {
		old := c.order[0]
		c.order = c.order[1:]
		c.used -= len(old) + 4*len(c.byKey[old])
		delete(c.byKey, old)
	}
	c.byKey[key] = ts
	c.order = append(c.order, key)
	c.used += size
}
