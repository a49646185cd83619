package proxy

import (
	"context"
	"net/http"
	"net/url"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/responsesearch"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// search.go answers the requests that need a search for a stored response the router does not
// know (package responsesearch runs it): 429 past the client's budget of searches or its rate
// limit, 503 past the budget of all clients together, 404 when no worker that answered has the
// id, 502/504 when no worker could say; and otherwise points the request at the holder found,
// which the policy is told of.

// The admission_rejections_total reasons of a search past its client's budget, and past the one
// of all clients together.
const (
	rejectedBySearchBudget      = "response_search"
	rejectedByTotalSearchBudget = "response_search_total"
)

// searchRefusal is the answer to a search that a budget refused: its admission_rejections_total
// reason and its error.
type searchRefusal struct {
	reason         string
	status         int
	typ, code, msg string
}

// searchRefusals answers a search past each budget: 429 past the client's own, 503 past the one
// of all clients together; both say when to try again.
var searchRefusals = map[responsesearch.Over]searchRefusal{
	responsesearch.OverClient: {rejectedBySearchBudget, fasthttp.StatusTooManyRequests, "rate_limit_error", "response_search_limit",
		"too many searches for unknown response ids from this client; try again later"},
	responsesearch.OverTotal: {rejectedByTotalSearchBudget, fasthttp.StatusServiceUnavailable, "server_error", "response_search_busy",
		"the router searches the workers for as many unknown response ids as it may a second (--response-search-total-per-second); try again shortly"},
}

// searchID is the stored response the request must find a worker for, or "" when it needs no
// search: an id route whose id the policy does not know (prepareByResponseID said so), or a turn
// continuing a response the policy does not know.
func (s *Server) searchID(ex *exchange) string {
	if ex.searching {
		return ex.responseID
	}
	req := ex.in.Request
	if !ex.route.storesResponses || s.responses == nil || req == nil || req.PreviousResponseID == "" {
		return ""
	}
	if _, ok := s.responses.ResponseHolder(ex.in.Context, req.PreviousResponseID); ok {
		return "" // the policy follows it
	}
	return req.PreviousResponseID
}

// findResponse runs the search the request needs, if any, and points the request at the holder:
// its only candidate on an id route, the worker its turn follows on a continuation. It reports
// false when it answered the request itself.
func (s *Server) findResponse(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	id := s.searchID(ex)
	if id == "" {
		return true
	}
	if !ex.searching { // a continuation: the id routes checked the misses before admission
		if s.search.Missed(id, ex.start) {
			s.notFound(ctx, ex, id, labelResponseMiss)
			return false
		}
		ex.label = labelResponseSearch
	}
	if wait, over := s.search.Admit(clientName(ex.caller.Tenant, ctx.RemoteIP()), time.Now()); over != responsesearch.Within {
		r := searchRefusals[over]
		ctx.Response.Header.Set(HeaderRetryAfter, retryAfter(wait))
		s.metrics.AdmissionRejections.WithLabelValues(r.reason).Inc()
		s.finish(ctx, ex, s.fail(ctx, ex, r.status, r.typ, r.code, r.msg))
		return false
	}
	// The client watch ends the search when the client leaves, as it ends a wait for admission.
	wait, stop := context.WithCancel(context.Background())
	defer ex.watchWait(stop)()
	res := s.search.Search(responsesearch.Query{ID: id, Candidates: ex.in.Candidates, Deadline: ex.deadline, Context: wait,
		Lookup: func(out *fasthttp.Request, w *workers.Worker) { s.lookupRequest(ctx, out, w, ex.rid, id) },
		Charge: func() bool { return s.chargeLookup(ctx, ex, id) }})
	switch {
	case res.Holder != nil:
		if s.responses != nil {
			s.responses.ResponseStored(ex.in.Context, id, res.Holder)
		}
		if ex.searching {
			ex.searching = false
			ex.in.Candidates = []*workers.Worker{res.Holder}
		} else {
			ex.follow = res.Holder
		}
		return true
	case res.Refused:
		return false // answered
	case ex.gone.Load():
		s.finish(ctx, ex, statusClientGone)
	case res.NotHere == 0:
		s.finish(ctx, ex, s.upstreamFailed(ctx, ex, res.Last)) // no worker could say
	default:
		// A worker that could not say may hold the id: 404 all the same, as the workers that
		// answered say (but not remembered as a miss).
		s.notFound(ctx, ex, id, labelResponseSearch)
	}
	return false
}

// notFound answers 404 response_not_found for id, in the route's shape, with label.
func (s *Server) notFound(ctx *fasthttp.RequestCtx, ex *exchange, id, label string) {
	ex.label, ex.decision = label, label
	ctx.Response.Header.Set(HeaderDecision, label)
	if s.labeled && ex.route.place == byPolicy {
		s.metrics.CacheAwareDecisions.WithLabelValues(label).Inc()
	}
	s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusNotFound, "invalid_request_error", "response_not_found",
		"Response with id '"+truncate(id, 200)+"' not found."))
}

// chargeLookup counts one lookup against the caller's rate limits, as admit counts the request
// itself; over them, it answers 429 and reports false.
func (s *Server) chargeLookup(ctx *fasthttp.RequestCtx, ex *exchange, id string) bool {
	a := s.opts.Admission
	if a == nil || a.Limiter == nil {
		return true
	}
	tenant := ex.caller.Tenant
	if tenant == "" {
		tenant = clientkeys.DefaultTenant
	}
	d := a.Limiter.Check(ex.in.Context, tenant, 0)
	rateLimitHeaders(&ctx.Response.Header, "requests", d.Requests)
	if d.Allowed {
		return true
	}
	ctx.Response.Header.Set(HeaderRetryAfter, retryAfter(d.RetryAfter))
	s.metrics.AdmissionRejections.WithLabelValues(rejectedByRate).Inc()
	s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded",
		"rate limit reached for tenant "+tenant+" while looking for response '"+truncate(id, 200)+"' on the workers; try again later"))
	return false
}

// lookupRequest writes the lookup of id on w: GET /v1/responses/{id}, with the credentials the
// request itself would carry to the worker and the request's id.
func (s *Server) lookupRequest(ctx *fasthttp.RequestCtx, out *fasthttp.Request, w *workers.Worker, rid, id string) {
	out.Header.SetMethod(http.MethodGet)
	out.SetRequestURI(w.URL() + responsesPrefix + url.PathEscape(id))
	if s.opts.ClientKeys == nil || s.opts.ForwardClientAuth {
		for _, name := range []string{"Authorization", "X-Api-Key"} {
			if v := ctx.Request.Header.Peek(name); len(v) > 0 {
				out.Header.SetBytesV(name, v) // copied into out
			}
		}
	}
	if auth := s.opts.Upstream.Authorization(w.URL()); auth != "" && len(out.Header.Peek("Authorization")) == 0 && len(out.Header.Peek("X-Api-Key")) == 0 {
		out.Header.Set("Authorization", auth)
	}
	out.Header.Set(HeaderRequestID, rid)
}
