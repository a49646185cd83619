package proxy

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// Admission is what the proxy asks before a routed request may go to a worker: its tenant's rate
// limits, then a place under the concurrency limits, waiting in the priority queue if need be.
// Both parts are optional.
type Admission struct {
	Limiter    admission.Limiter     // per-tenant rates; nil: none
	Controller *admission.Controller // concurrency limits and the queue; nil: none
	// PriorityHeader lets a client name its level in x-priority when its key names none.
	PriorityHeader bool
}

// Header names of admission.
const (
	HeaderPriority = "x-priority" // the client's priority level, when --priority-header allows it
)

// Reasons of admission_rejections_total that the admission package does not give: a request
// over its tenant's rates, and one still queued when the shutdown grace ended.
const (
	rejectedByRate     = "rate_limit"
	rejectedByShutdown = "shutdown"
)

// EndQueue answers every request still waiting for admission, and every one that comes to wait
// from now on, 503 shutting_down with Retry-After, and closes its connection: the router calls it
// when the shutdown grace ends, so that queued requests get an answer a client can retry rather
// than a connection cut by the exit.
func (s *Server) EndQueue() { s.closeQueue() }

// admit applies the rate limits and admission control to a request whose worker candidates are
// known. It reports false when the request was answered (429, 408 after a wait that outlasted
// the queue timeout, or 400 for an unknown priority) or its client left while it waited;
// otherwise the request holds ex.permit, if any, until it ends.
func (s *Server) admit(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	a := s.opts.Admission
	tenant := ex.caller.Tenant
	if tenant == "" {
		tenant = clientkeys.DefaultTenant
	}
	if a.Limiter != nil {
		tokens := len(ctx.PostBody())/reqkey.BytesPerToken + ex.in.Request.MaxTokens
		d := a.Limiter.Check(ex.in.Context, tenant, tokens)
		rateLimitHeaders(&ctx.Response.Header, "requests", d.Requests)
		rateLimitHeaders(&ctx.Response.Header, "tokens", d.Tokens)
		if !d.Allowed {
			msg := "rate limit reached for tenant " + tenant + "; try again later"
			if d.TooLarge {
				msg = "the request's estimated tokens exceed the tenant's tokens per minute"
			} else {
				ctx.Response.Header.Set(HeaderRetryAfter, retryAfter(d.RetryAfter))
			}
			s.metrics.AdmissionRejections.WithLabelValues(rejectedByRate).Inc()
			s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded", msg))
			return false
		}
	}
	if a.Controller == nil {
		return true
	}
	priority := ex.caller.Priority
	if priority == "" && a.PriorityHeader {
		priority = string(ctx.Request.Header.Peek(HeaderPriority))
	}
	// The wait ends early when the client leaves: the client watch cancels it.
	wait, stop := context.WithDeadline(ex.in.Context, ex.deadline)
	defer ex.watchWait(stop)()
	defer context.AfterFunc(s.queueClosed, stop)() // the shutdown grace ended
	permit, err := a.Controller.Admit(wait, admission.Ticket{Tenant: tenant, Priority: priority, Model: ex.in.Model})
	var rej *admission.Rejection
	closing := err != nil && s.queueClosed.Err() != nil && !ex.gone.Load()
	switch {
	case closing:
		s.metrics.AdmissionRejections.WithLabelValues(rejectedByShutdown).Inc()
	case errors.As(err, &rej):
		s.metrics.AdmissionRejections.WithLabelValues(rej.Reason.String()).Inc()
	}
	switch {
	case err == nil:
		ex.permit = permit
		return true
	case closing:
		ctx.Response.Header.Set(HeaderRetryAfter, "1")
		ctx.SetConnectionClose()
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusServiceUnavailable, "server_error", "shutting_down",
			"the router is shutting down and the request was still waiting for admission; try again"))
	case errors.Is(err, admission.ErrUnknownPriority):
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusBadRequest, "invalid_request_error", "unknown_priority",
			"unknown priority level "+strconv.Quote(truncate(priority, 64))))
	case errors.As(err, &rej) && rej.Reason == admission.ClientGone:
		s.finish(ctx, ex, statusClientGone)
	case errors.As(err, &rej) && rej.Reason == admission.QueueTimeout:
		// 408, as the vLLM router answers a request that waited out its queue timeout; 429 is for
		// a full queue. Clients retry both.
		ctx.Response.Header.Set(HeaderRetryAfter, retryAfter(rej.RetryAfter))
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusRequestTimeout, "timeout_error", string(rej.Reason),
			"the request waited --queue-timeout-secs for admission without starting; try again later"))
	case errors.As(err, &rej):
		ctx.Response.Header.Set(HeaderRetryAfter, retryAfter(rej.RetryAfter))
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusTooManyRequests, "rate_limit_error", string(rej.Reason),
			"the router is at capacity ("+string(rej.Reason)+"); try again later"))
	default:
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusServiceUnavailable, "server_error", "admission_failed", err.Error()))
	}
	return false
}

// release gives back the request's place under the concurrency limits, once its worker attempt
// is closed; it may be called on every path that ends the request.
func (ex *exchange) release() {
	if ex.permit != nil {
		ex.permit.Release()
	}
}

// rateLimitHeaders sets the x-ratelimit-limit-, -remaining- and -reset- headers of one
// dimension ("requests" or "tokens"), when it is limited.
func rateLimitHeaders(h *fasthttp.ResponseHeader, dim string, q admission.Quota) {
	if q.Limit == 0 {
		return
	}
	h.Set("x-ratelimit-limit-"+dim, strconv.Itoa(q.Limit))
	h.Set("x-ratelimit-remaining-"+dim, strconv.Itoa(q.Remaining))
	h.Set("x-ratelimit-reset-"+dim, q.Reset.Round(time.Millisecond).String())
}

// retryAfter is a Retry-After value in whole seconds, at least 1.
func retryAfter(d time.Duration) string {
	return strconv.Itoa(max(1, int((d+time.Second-1)/time.Second)))
}

// Outcomes of a wait for KV room (session_admission_waits_total; metrics.SessionAdmissionOutcomes).
const (
	holdOffered = "offered"     // room may have appeared: the policy chose again
	holdTimeout = "timeout"     // the wait's deadline passed: placed anyway
	holdFull    = "queue_full"  // too many waited already: placed anyway
	holdGone    = "client_gone" // the client left while it waited
)

// hold waits, as the policy's Hold says, for KV room for the request's session: its place in the
// session queue is kept across its waits, so a request that lost the room to another waits again
// where it was. It reports false when the client left; otherwise the policy chooses again, told
// in ex.in that the request waited, and that it may wait no more when the wait is over.
func (s *Server) hold(ex *exchange, h *policy.Hold) bool {
	if ex.held == nil {
		ex.held, ex.heldIn = &admission.SessionTicket{}, h.Queue
	}
	ex.held.Need, ex.held.Served = h.Need, h.Served
	wait, stop := context.WithDeadline(ex.in.Context, ex.deadline)
	defer ex.watchWait(stop)()
	s.metrics.SessionAdmissionWaiting.Inc()
	start := time.Now()
	err := h.Queue.Wait(wait, ex.held)
	s.metrics.SessionAdmissionWaiting.Dec()
	s.metrics.SessionAdmissionWait.Observe(time.Since(start).Seconds())
	ex.in.Held = true
	outcome := holdOffered
	switch {
	case err == nil:
	case errors.Is(err, admission.ErrSessionWaitTimeout):
		outcome, ex.in.HoldOver = holdTimeout, true
	case errors.Is(err, admission.ErrSessionWaitFull):
		outcome, ex.in.HoldOver = holdFull, true
	case ex.gone.Load():
		outcome = holdGone
	default: // the request's own deadline: placed now, for its attempt to end it
		outcome, ex.in.HoldOver = holdTimeout, true
	}
	s.metrics.SessionAdmissionWaits.WithLabelValues(outcome).Inc()
	if ex.attempts == 0 {
		// The fleet may have changed while it waited (a worker joined: room): the request's
		// candidates are the fleet's now. After an attempt they keep the tried workers out.
		ex.in.Candidates, _, _ = s.candidates(ex.in.Request.Model)
		ex.in.All = s.pool.All()
		if ex.pd != nil {
			s.pdCandidates(ex)
		}
	}
	return outcome != holdGone
}

// unhold gives the request's place in the session queue up, once it was placed or ended, so the
// next waiting request is offered room; it may be called on every path.
func (ex *exchange) unhold() {
	if ex.held != nil {
		ex.heldIn.Done(ex.held)
		ex.held = nil
	}
}
