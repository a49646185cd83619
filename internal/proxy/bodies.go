package proxy

import (
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// bodyBudget bounds the request-body bytes the listener holds at once, all requests together
// (--max-request-body-bytes-total). fasthttp reads a body whole, into a buffer sized by its
// Content-Length, before the handler runs; so the bytes are counted when a request's headers
// arrive (fasthttp's HeaderReceived), before any of its body is read, and a request that would
// take the total over the bound is refused there: its body is never read, and it is answered 503
// in its route's shape with Retry-After. A body without a Content-Length (chunked) counts as
// --max-payload-size, the most it may grow to.
//
// The bytes of a request are given back exactly once, by whichever of these comes first: its
// end (a routed request's exchange end, which for a streamed answer comes when the stream does,
// since the body buffer is held until then; any other request's handler return), the error
// answer of a request that could not be read, or the next request on the same connection. A connection that
// ends while its body is read may end with neither handler nor error answer; its count stays as
// a pending entry that is given back once the body's read deadline has certainly passed, when the
// bound is next reached, so no client can keep the budget by abandoning requests.
type bodyBudget struct {
	limit   int64         // bytes held at once
	maxBody int64         // the largest body accepted (--max-payload-size)
	expiry  time.Duration // longer than any body may take to arrive

	mu      sync.Mutex
	held    int64
	pending map[*fasthttp.RequestHeader]heldBody // requests whose body is being read
}

// heldBody is one request's share of the budget, from its headers to its handler.
type heldBody struct {
	bytes   int64
	refused bool
	since   time.Time
}

// newBodyBudget returns a budget of limit bytes; nil (no bound) when limit is 0. readTimeout is
// the longest a request's body may take to arrive.
func newBodyBudget(limit, maxBody int64, readTimeout time.Duration) *bodyBudget {
	if limit <= 0 {
		return nil
	}
	return &bodyBudget{limit: limit, maxBody: maxBody, expiry: readTimeout + time.Second,
		pending: map[*fasthttp.RequestHeader]heldBody{}}
}

// reserve counts the body a request's headers announce. It returns the body size limit for
// fasthttp: 0 keeps the server's, 1 stops the read of a refused request's body at once.
func (b *bodyBudget) reserve(h *fasthttp.RequestHeader) int {
	if b == nil {
		return 0
	}
	n := int64(h.ContentLength())
	if n < 0 { // chunked, or read to the connection's end
		n = b.maxBody
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if old, ok := b.pending[h]; ok { // the connection's previous request ended unanswered
		b.held -= old.bytes
		delete(b.pending, h)
	}
	if n == 0 || n > b.maxBody { // nothing to hold, or refused with 413 before it is read
		return 0
	}
	now := time.Now()
	if b.held+n > b.limit {
		b.expire(now)
	}
	if b.held+n > b.limit {
		b.pending[h] = heldBody{refused: true, since: now}
		return 1
	}
	b.held += n
	b.pending[h] = heldBody{bytes: n, since: now}
	return 0
}

// expire gives back the count of requests whose body can no longer be arriving: their read
// deadline passed and neither their handler nor an error answer took them.
func (b *bodyBudget) expire(now time.Time) {
	for h, e := range b.pending {
		if now.Sub(e.since) > b.expiry {
			b.held -= e.bytes
			delete(b.pending, h)
		}
	}
}

// take hands a request's count over to its handler or error answer, which must release it; it
// reports whether the request was refused.
func (b *bodyBudget) take(h *fasthttp.RequestHeader) (bytes int64, refused bool) {
	if b == nil {
		return 0, false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	e, ok := b.pending[h]
	if ok {
		delete(b.pending, h)
	}
	return e.bytes, e.refused
}

// release gives back bytes handed over by take.
func (b *bodyBudget) release(bytes int64) {
	if b == nil || bytes == 0 {
		return
	}
	b.mu.Lock()
	b.held -= bytes
	b.mu.Unlock()
}

// Held is the request-body bytes counted against the budget now; 0 without a budget.
func (b *bodyBudget) Held() int64 {
	if b == nil {
		return 0
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held
}

// refuseBody answers a request refused by the body budget: 503 (529 on Anthropic routes) with
// Retry-After, and the connection closed, since its body was not read.
func (s *Server) refuseBody(ctx *fasthttp.RequestCtx, shape errorShape) int {
	ctx.Response.Header.Set(HeaderRetryAfter, "1")
	ctx.SetConnectionClose()
	return writeFastError(ctx, shape, fasthttp.StatusServiceUnavailable, "server_error", "request_bodies_over_budget",
		"the router holds as many request bodies as it may at once (--max-request-body-bytes-total); try again shortly")
}
