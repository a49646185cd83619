// Package tokenize asks an engine for a request's prompt tokens, as it will render them: vLLM's
// POST /tokenize with a chat's messages and tools and add_generation_prompt, or a completion's
// prompt. A policy that matches requests against the engines' KV-cache events needs them; the
// policy asks for them through its environment (policy.Env.Tokenizer, Input.PromptTokens) when
// a request is worth the round trip, the request renders its own query (Query: package protocol writes it), and this package does the rest: which worker to ask
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
	"errors"
	"fmt"
	"hash/maphash"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/protocol"
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

// Query renders a request's POST /tokenize body for the model the engine is asked for, appended
// to dst; ok is false when the request would not be rendered exactly as the engine will serve it,
// and is not tokenized. A request that package protocol read renders its own (protocol.Request),
// from its one parse of body.
type Query interface {
	AppendTokenizeBody(dst, body []byte, model string) (ask []byte, ok bool)
}

// maxAnswer bounds the answer read from /tokenize.
const maxAnswer = 8 << 20

// Client asks for prompt tokens and remembers the answers.
type Client struct {
	opts  Options
	http  *http.Client
	cache cache
	// refreshing bounds the background calls (refresh) in flight: one slot each.
	refreshing chan struct{}
	// inexact are the models (as asked) whose prompts were found not to begin with their
	// conversation's earlier turn's tokens: their prompts are always asked in full.
	inexact sync.Map
}

// maxRefreshing bounds the calls made in the background at once; a turn that finds them all
// busy leaves its own tokens unasked, and its next turn starts from an earlier one's.
const maxRefreshing = 2

// New returns a client with an empty cache.
func New(opts Options) *Client {
	return &Client{opts: opts, http: opts.Dialer.Client(), cache: newCache(opts.CacheBytes),
		refreshing: make(chan struct{}, maxRefreshing)}
}

// PromptTokens gives the prompt tokens of the request a policy is choosing for (Tokens, with the
// request's route path, routing text, candidates, model and body): the client is the policies'
// policy.Tokenizer.
func (c *Client) PromptTokens(in policy.Input) ([]uint32, string) {
	return c.Tokens(in.Path, in.Request.Text, in.Candidates, in.Request.Model, in.Body, in.Request)
}

// Tokens returns the prompt tokens of a request for model (its routing text text, on the route
// scope) as the engine of its least loaded candidate renders them, and the LoRA adapter they are
// for ("" for a base model); nil when they are not to be had: no candidate lists the model as
// its first base model or as an adapter, q cannot render body exactly, or the call failed or
// timed out. q renders the query only when the answer is not remembered.
//
// A turn of a conversation whose earlier turn was tokenized is not waited for: it gets the
// earlier turn's tokens, the start of its own prompt, at once, and its own are asked in the
// background (refresh) for the turn after it. Only the tokens an engine could have cached
// before this turn matter to the choice, and those are the earlier turn's, up to the part this
// turn appended (which no engine has seen yet, except the assistant's answer on the worker that
// wrote it, which holds the earlier turn as well). The background answer checks that its
// prompt does begin with the earlier turn's tokens; a model whose prompts do not is asked in
// full from then on.
func (c *Client) Tokens(scope, text string, candidates []*workers.Worker, model string, body []byte, q Query) ([]uint32, string) {
	w, asked, lora, ok := workers.TokenizeOn(candidates, model)
	if !ok {
		return nil, ""
	}
	// The history keys of the three APIs share one framing, and their prompts may still render
	// apart (a Messages tool_use input is rewritten as Python writes JSON): the scope keeps them
	// apart.
	key, earlier := c.cache.keys(scope, asked, text)
	if ts, ok := c.cache.get(key); ok {
		c.opts.Metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeCached).Inc()
		return ts, lora
	}
	if _, inexact := c.inexact.Load(asked); !inexact {
		for _, k := range slices.Backward(earlier) {
			if ts, ok := c.cache.get(k); ok {
				c.opts.Metrics.TokenizeRequests.WithLabelValues(metrics.TokenizePrefix).Inc()
				c.refresh(w, asked, key, ts, body, q)
				return ts, lora
			}
		}
	}
	ask, ok := render(q, body, asked)
	if !ok {
		return nil, "" // not rendered exactly: routed as without events
	}
	ts, ok := c.ask(w, ask)
	if ok {
		c.cache.put(key, ts)
		return ts, lora
	}
	return nil, ""
}

// ask calls for the tokens of the query ask, counts the call, and releases the query.
func (c *Client) ask(w *workers.Worker, ask *query) ([]uint32, bool) {
	start := time.Now()
	ts, err := c.call(w, ask)
	c.opts.Metrics.TokenizeDuration.Observe(time.Since(start).Seconds())
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		c.opts.Metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeTimeout).Inc()
		return nil, false
	case err != nil:
		c.opts.Metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeError).Inc()
		c.opts.Log.Debug("tokenize failed", "worker", w.Name(), "error", err)
		return nil, false
	}
	c.opts.Metrics.TokenizeRequests.WithLabelValues(metrics.TokenizeOK).Inc()
	return ts, true
}

// refresh asks, in the background, for the tokens of a turn that was given those of an earlier
// one (earlier), and remembers them under key; when every background slot is busy it asks
// nothing. The query is rendered now: body is the request's and does not outlive it. An answer
// that does not begin with earlier marks the model inexact.
func (c *Client) refresh(w *workers.Worker, asked string, key uint64, earlier []uint32, body []byte, q Query) {
	select {
	case c.refreshing <- struct{}{}:
	default:
		return
	}
	ask, ok := render(q, body, asked)
	if !ok {
		<-c.refreshing
		return
	}
	go func() {
		defer func() { <-c.refreshing }()
		ts, ok := c.ask(w, ask)
		if !ok {
			return
		}
		if len(ts) < len(earlier) || !slices.Equal(ts[:len(earlier)], earlier) {
			c.opts.Metrics.TokenizeRequests.WithLabelValues(metrics.TokenizePrefixMismatch).Inc()
			if _, known := c.inexact.LoadOrStore(asked, true); !known {
				c.opts.Log.Info("a prompt does not begin with its earlier turn's tokens: the model's prompts are tokenized in full", "model", asked)
			}
			return
		}
		c.cache.put(key, ts)
	}()
}

// call asks the render service (--tokenize-url), else w, for the tokens of the query ask, and
// releases it.
func (c *Client) call(w *workers.Worker, ask *query) ([]uint32, error) {
	base := w.URL()
	if c.opts.URL != "" {
		base = c.opts.URL
	}
	defer ask.release()
	ctx, cancel := context.WithCancel(context.Background())
	if t := c.opts.Dialer.Timeouts.TokenizeFor(ask.size()); t > 0 {
		ctx, cancel = context.WithTimeout(ctx, t)
	}
	defer cancel()
	body := ask.body()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/tokenize", body)
	if err != nil {
		body.Close()
		return nil, err
	}
	req.ContentLength = int64(ask.size())
	req.GetBody = func() (io.ReadCloser, error) { return ask.body(), nil }
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("/tokenize answered %d", resp.StatusCode)
	}
	buf := answers.Get().(*bytes.Buffer)
	defer func() {
		if buf.Cap() <= maxKeptBuffer {
			answers.Put(buf)
		}
	}()
	buf.Reset()
	if n := resp.ContentLength; n > 0 && n <= maxAnswer {
		buf.Grow(int(n))
	}
	if _, err := buf.ReadFrom(io.LimitReader(resp.Body, maxAnswer+1)); err != nil {
		return nil, err
	}
	if buf.Len() > maxAnswer {
		return nil, fmt.Errorf("/tokenize answer over %d bytes", maxAnswer)
	}
	// A token takes at least two bytes of the answer (a digit and a comma): a query's prompt
	// has about a token per four bytes of it, which sizes the slice in one go.
	return parseTokens(buf.Bytes(), min(ask.size()/4, buf.Len()/2))
}

// queries are the buffers /tokenize queries are rendered into, kept between calls as answers are.
var queries = sync.Pool{New: func() any { return new([]byte) }}

// query is one rendered /tokenize query, in a buffer from queries. The buffer goes back when the
// call and every request body made of it are done with it: a transport may read a body after the
// call has returned (net/http closes it when it is done with it, perhaps on a goroutine of its
// own), and makes a body again (GetBody) to send a request again.
type query struct {
	buf  *[]byte
	refs atomic.Int32 // the call's, and one per body not closed yet
}

// render renders q's query for body and model; the caller holds it until release.
func render(q Query, body []byte, model string) (*query, bool) {
	buf := queries.Get().(*[]byte)
	b, ok := q.AppendTokenizeBody((*buf)[:0], body, model)
	if !ok {
		queries.Put(buf)
		return nil, false
	}
	*buf = b
	ask := &query{buf: buf}
	ask.refs.Store(1)
	return ask, true
}

func (q *query) size() int { return len(*q.buf) }

// body is a request body of the query.
func (q *query) body() io.ReadCloser {
	q.refs.Add(1)
	b := &queryBody{q: q}
	b.Reset(*q.buf)
	return b
}

// release ends one hold on the buffer; the last gives it back, unless it grew past maxKeptBuffer.
func (q *query) release() {
	if q.refs.Add(-1) == 0 && cap(*q.buf) <= maxKeptBuffer {
		queries.Put(q.buf)
	}
}

// queryBody is one request body of a query: closing it, once, ends its hold on the buffer.
type queryBody struct {
	bytes.Reader
	q    *query
	once sync.Once
}

func (b *queryBody) Close() error {
	b.once.Do(b.q.release)
	return nil
}

// answers are the buffers the answers of /tokenize are read into, kept between calls.
var answers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxKeptBuffer bounds the buffers kept for queries and answers: one that grew past it (the query
// of a prompt of about 2 MB, the answer of one of about 300k tokens) is left to the collector.
const maxKeptBuffer = 2 << 20

// cache remembers answers by a hash of their scope, model and routing text, oldest forgotten
// first.
type cache struct {
	seed   maphash.Seed
	mu     sync.Mutex
	budget int
	used   int
	byKey  map[uint64][]uint32
	order  []uint64
}

func newCache(budget int) cache {
	return cache{seed: maphash.MakeSeed(), budget: budget, byKey: map[uint64][]uint32{}}
}

// entryBytes is what one answer costs the cache besides its tokens: its key, in the map and in
// the order.
const entryBytes = 64

// keys returns the key of a prompt's answer, and the keys of the answers of its conversation's
// earlier turns (protocol.TurnEnds), shortest first: one pass over the text.
func (c *cache) keys(scope, asked, text string) (key uint64, earlier []uint64) {
	var h maphash.Hash
	h.SetSeed(c.seed)
	_, _ = h.WriteString(scope)
	_ = h.WriteByte(0)
	_, _ = h.WriteString(asked)
	_ = h.WriteByte(0)
	at := 0
	protocol.TurnEnds(text, func(n int) {
		_, _ = h.WriteString(text[at:n])
		at = n
		earlier = append(earlier, h.Sum64())
	})
	_, _ = h.WriteString(text[at:])
	return h.Sum64(), earlier
}

func (c *cache) get(key uint64) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ts, ok := c.byKey[key]
	return ts, ok
}

func (c *cache) put(key uint64, ts []uint32) {
	size := entryBytes + 4*len(ts)
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
		c.used -= entryBytes + 4*len(c.byKey[old])
		delete(c.byKey, old)
	}
	c.byKey[key] = ts
	c.order = append(c.order, key)
	c.used += size
}
