package proxy

import (
	"cmp"
	"context"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// search.go finds the worker that holds a stored response the router does not know: one named
// in an id route's path (GET, DELETE, cancel, input_items), or a POST /v1/responses turn's
// previous_response_id (the router's store was lost in a restart, or never shared with the
// replica that relayed it). Only the worker that stored a response can answer for it, and any
// other answers 404, so the candidates are asked GET /v1/responses/{id}, which vLLM serves:
//
//   - at most SearchOptions.Concurrency of them at once, least loaded first, and no more once one
//     has it: a search costs at most the fleet's size in lookups, and usually fewer;
//   - each lookup counts against the caller's rate limits, as the request itself did;
//   - each client may start SearchOptions.PerMinute searches a minute (searchBudget); past it,
//     429 in the route's error shape;
//   - all clients together may start SearchOptions.TotalPerSecond searches a second, so the
//     lookups searches cost the fleet are at most that many times its size a second, however
//     many clients ask; past it, 503 with Retry-After;
//   - the holder found is told to the policy, so the next request for the id goes straight to it,
//     and an id that every candidate answered 404 for is remembered as a miss (misses.go).
//
// The request itself then goes to the holder alone.

// SearchOptions bound the searches for stored responses the router does not know.
type SearchOptions struct {
	// Concurrency is how many workers one search asks at once (--response-search-concurrency).
	Concurrency int
	// PerMinute is how many searches each client may start a minute, with a minute's worth at
	// once (--response-search-per-minute); 0: no bound. A client is its key's tenant when client
	// keys are checked, else its address.
	PerMinute int
	// TotalPerSecond is how many searches all clients together may start a second, a second's
	// worth at once (--response-search-total-per-second); 0: no bound.
	TotalPerSecond float64
}

// DefaultSearchConcurrency is the workers one search asks at once when SearchOptions names none.
const DefaultSearchConcurrency = 4

// lookupTimeout bounds one lookup: a worker answers GET /v1/responses/{id} from its memory, so
// one that takes longer is failing, and the search does not wait on it longer than this.
const lookupTimeout = 10 * time.Second

// maxLookupBody is the most of a lookup's answer read to keep its connection; a longer answer
// (a large stored response) is dropped with its connection.
const maxLookupBody = 64 << 10

// The admission_rejections_total reasons of a search past its client's budget, and past the one
// of all clients together.
const (
	rejectedBySearchBudget      = "response_search"
	rejectedByTotalSearchBudget = "response_search_total"
)

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
// false when it answered the request itself: 404 when no worker that answered has the id, 429
// past the client's budget or rate limit, 502/504 when no worker could answer.
func (s *Server) findResponse(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	id := s.searchID(ex)
	if id == "" {
		return true
	}
	if !ex.searching { // a continuation: the id routes checked the misses before admission
		if s.misses.has(id, ex.start) {
			s.notFound(ctx, ex, id, labelResponseMiss)
			return false
		}
		ex.label = labelResponseSearch
	}
	if wait, ok := s.searches.allow(s.searchClient(ctx, ex), time.Now()); !ok {
		ctx.Response.Header.Set(HeaderRetryAfter, retryAfter(wait))
		s.metrics.AdmissionRejections.WithLabelValues(rejectedBySearchBudget).Inc()
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusTooManyRequests, "rate_limit_error", "response_search_limit",
			"too many searches for unknown response ids from this client; try again later"))
		return false
	}
	if wait, ok := s.totalSearches.allow("", time.Now()); !ok {
		ctx.Response.Header.Set(HeaderRetryAfter, retryAfter(wait))
		s.metrics.AdmissionRejections.WithLabelValues(rejectedByTotalSearchBudget).Inc()
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusServiceUnavailable, "server_error", "response_search_busy",
			"the router searches the workers for as many unknown response ids as it may a second (--response-search-total-per-second); try again shortly"))
		return false
	}
	res := s.search(ctx, ex, id)
	switch {
	case res.holder != nil:
		if s.responses != nil {
			s.responses.ResponseStored(ex.in.Context, id, res.holder)
		}
		if ex.searching {
			ex.searching = false
			ex.in.Candidates = []*workers.Worker{res.holder}
		} else {
			ex.follow = res.holder
		}
		return true
	case res.refused:
		return false // answered
	case ex.gone.Load():
		s.finish(ctx, ex, statusClientGone)
	case res.notHere == 0:
		s.finish(ctx, ex, s.upstreamFailed(ctx, ex, res.last)) // no worker could say
	default:
		// A worker that could not say may hold the id: 404 all the same, as the workers that
		// answered say, but not remembered as a miss.
		if !res.failed {
			s.misses.add(id, time.Now()) // every candidate answered, and none has it
		}
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

// searchClient is the key of the client's search budget (clientName).
func (s *Server) searchClient(ctx *fasthttp.RequestCtx, ex *exchange) string {
	return clientName(ex.caller.Tenant, ctx.RemoteIP())
}

// searchResult is how a search ended.
type searchResult struct {
	holder  *workers.Worker // the worker that has the id; nil when none was found
	failed  bool            // a lookup failed: a worker that may hold the id could not say
	last    failure         // the last lookup's failure
	notHere int             // the workers that answered 404
	refused bool            // a lookup was over the caller's rate limit: the request was answered 429
}

// lookupResult is one worker's answer to a lookup.
type lookupResult struct {
	w      *workers.Worker
	found  bool
	failed bool    // the worker could not say: it did not answer, or answered neither 2xx nor 404
	f      failure // why, when failed; a kind when it counts as an upstream error
}

// search asks the request's candidates, in order, whether they hold id, Concurrency at a time,
// until one does or all have answered. The lookups run on goroutines of their own and touch
// nothing of the request: each gets its own copy of what it sends. All have ended when search
// returns.
func (s *Server) search(ctx *fasthttp.RequestCtx, ex *exchange, id string) searchResult {
	k := s.opts.ResponseSearch.Concurrency
	if k < 1 {
		k = DefaultSearchConcurrency
	}
	// The client watch ends the search when the client leaves, as it ends a wait for admission.
	wait, stop := context.WithCancel(context.Background())
	defer stop()
	ex.cancelWait.Store(&stop)
	defer ex.cancelWait.Store(nil)
	if ex.gone.Load() {
		stop()
	}
	deadline := time.Now().Add(lookupTimeout)
	if ex.deadline.Before(deadline) {
		deadline = ex.deadline
	}
	open := &openConns{}
	// The least loaded first: a lookup is cheap, but a busy worker answers it last.
	candidates := slices.SortedStableFunc(slices.Values(ex.in.Candidates), func(a, b *workers.Worker) int { return cmp.Compare(a.Load(), b.Load()) })
	results := make(chan lookupResult, len(candidates))
	var res searchResult
	next, running := 0, 0
	defer func() {
		open.closeAll() // the search is over: lookups still running end at once
		for ; running > 0; running-- {
			<-results
		}
	}()
	for res.holder == nil {
		for running < k && next < len(candidates) && wait.Err() == nil {
			if !s.chargeLookup(ctx, ex, id) {
				res.refused = true
				return res
			}
			w := candidates[next]
			out := fasthttp.AcquireRequest()
			s.lookupRequest(ctx, out, w, ex.rid, id)
			next++
			running++
			go func() {
				defer fasthttp.ReleaseRequest(out)
				results <- s.lookup(out, w, deadline, open)
			}()
		}
		if running == 0 {
			return res
		}
		select {
		case <-wait.Done():
			return res
		case r := <-results:
			running--
			switch {
			case r.found:
				res.holder = r.w
			case !r.failed:
				res.notHere++
			default:
				res.failed, res.last = true, r.f
				if r.f.kind != "" {
					s.metrics.UpstreamErrors.WithLabelValues(r.f.kind).Inc()
				}
			}
		}
	}
	return res
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

// lookup sends one lookup and reads its answer's status: 2xx, the worker has the id; 404, it has
// not; anything else, or no answer by deadline, it could not say. A pooled connection the worker
// had closed is re-dialled once, as send does.
func (s *Server) lookup(out *fasthttp.Request, w *workers.Worker, deadline time.Time, open *openConns) lookupResult {
	pool, err := s.upstreams.pool(w.URL())
	if err != nil {
		return lookupResult{w: w, failed: true, f: failure{kind: metrics.ErrConnect, message: "the worker's URL is not usable"}}
	}
	for fresh := false; ; fresh = true {
		get := pool.get
		if fresh {
			get = pool.dial
		}
		c, err := get()
		if err == nil {
			c.worker = w
			if !open.add(c) {
				_ = c.conn.Close()
				return lookupResult{w: w, failed: true} // the search is over: its result is not read
			}
			var status int
			status, err = s.lookupOn(c, out, deadline, open)
			if err == nil {
				switch {
				case status/100 == 2:
					return lookupResult{w: w, found: true}
				case status == http.StatusNotFound:
					return lookupResult{w: w}
				}
				f := failure{message: "a worker answered the response's lookup with " + strconv.Itoa(status)}
				if status >= 500 {
					f.kind = metrics.ErrStatus
				}
				return lookupResult{w: w, failed: true, f: f}
			}
		}
		f := classify(err, c, !time.Now().Before(deadline))
		if !f.stale || fresh {
			if f.kind == metrics.ErrFirstByte {
				f.kind = metrics.ErrTimeout // a lookup has one deadline, not a first-byte one
			}
			f.message = "a worker did not answer the response's lookup: " + f.message
			return lookupResult{w: w, failed: true, f: f}
		}
	}
}

// lookupOn writes the lookup on c and reads its answer, and takes c off open; c goes back to the
// pool when the answer was read whole before the search ended, and is closed otherwise.
func (s *Server) lookupOn(c *upConn, out *fasthttp.Request, deadline time.Time, open *openConns) (int, error) {
	fail := func(err error) (int, error) {
		open.remove(c)
		_ = c.conn.Close()
		return 0, err
	}
	_ = c.conn.SetDeadline(deadline)
	if err := out.Write(c.bw); err != nil {
		c.writeFailed = true
		return fail(err)
	}
	if err := c.bw.Flush(); err != nil {
		c.writeFailed = true
		return fail(err)
	}
	c.wrote = true
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	resp.StreamBody = true
	if err := resp.Read(c.br); err != nil {
		return fail(err)
	}
	status := resp.StatusCode()
	whole := resp.Header.ContentLength() != -2 && !resp.ConnectionClose()
	if body := resp.BodyStream(); body != nil && whole {
		n, err := io.CopyN(io.Discard, body, maxLookupBody+1)
		whole = err == io.EOF && n <= maxLookupBody
	}
	_ = resp.CloseBodyStream()
	if open.remove(c) && whole {
		_ = c.conn.SetDeadline(time.Time{})
		c.pool.put(c)
	} else {
		_ = c.conn.Close()
	}
	return status, nil
}

// openConns is the connections of a search's running lookups, for the search to close at its
// end; a lookup that would start after that closes its own.
type openConns struct {
	mu     sync.Mutex
	conns  map[*upConn]struct{}
	closed bool
}

func (o *openConns) add(c *upConn) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.closed {
		return false
	}
	if o.conns == nil {
		o.conns = map[*upConn]struct{}{}
	}
	o.conns[c] = struct{}{}
	return true
}

// remove takes c off the list; it reports false when the search ended meanwhile and closed it.
func (o *openConns) remove(c *upConn) bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	delete(o.conns, c)
	return !o.closed
}

func (o *openConns) closeAll() {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.closed = true
	for c := range o.conns {
		_ = c.conn.Close()
	}
}
