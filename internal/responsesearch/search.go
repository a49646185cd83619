// Package responsesearch finds the worker that holds a stored response the router does not know:
// one named in an id route's path (GET, DELETE, cancel, input_items), or a POST /v1/responses
// turn's previous_response_id (the router's store was lost in a restart, or never shared with
// the replica that relayed it). Only the worker that stored a response can answer for it, and any
// other answers 404, so the candidates are asked GET /v1/responses/{id}, which vLLM serves:
//
//   - at most Options.Concurrency of them at once, least loaded first, and no more once one has
//     it: a search costs at most the fleet's size in lookups, and usually fewer;
//   - each lookup is charged to the caller (Query.Charge: the proxy counts it against the
//     caller's rate limits, as the request itself was), and bounded by upstream.Timeouts.Lookup;
//   - each client may start Options.PerMinute searches a minute, and all clients together
//     Options.TotalPerSecond searches a second (Searcher.Admit, budget.go), so the lookups
//     searches cost the fleet are at most that many times its size a second, however many
//     clients ask;
//   - an id that every candidate answered 404 for is remembered as a miss for a few seconds
//     (misses.go), and asked of no worker meanwhile.
//
// The package decides nothing about HTTP answers: the proxy answers the request from the Result
// (the holder, 404, or the failure), tells the policy where the response lives, and sends the
// request to the holder.
package responsesearch

import (
	"cmp"
	"context"
	"io"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Options bound the searches for stored responses the router does not know.
type Options struct {
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

// DefaultConcurrency is the workers one search asks at once when Options names none.
const DefaultConcurrency = 4

// maxLookupBody is the most of a lookup's answer read to keep its connection; a longer answer
// (a large stored response) is dropped with its connection.
const maxLookupBody = 64 << 10

// Searcher runs the searches of one router.
type Searcher struct {
	opts    Options
	pools   *upstream.Pools
	metrics *metrics.Metrics
	misses  *misses
	clients *budget // each client's searches
	total   *budget // all clients' searches together
}

// New returns the searcher of a router whose lookups go through pools (bounded by its
// Timeouts.Lookup), counting failed lookups in m's upstream errors.
func New(opts Options, pools *upstream.Pools, m *metrics.Metrics) *Searcher {
	if opts.Concurrency < 1 {
		opts.Concurrency = DefaultConcurrency
	}
	return &Searcher{opts: opts, pools: pools, metrics: m, misses: newMisses(),
		clients: newClientBudget(opts.PerMinute), total: newTotalBudget(opts.TotalPerSecond)}
}

// Over says which budget refused a search.
type Over uint8

const (
	Within     Over = iota
	OverClient      // the client's searches a minute
	OverTotal       // all clients' searches a second
)

// Admit takes one search from client's budget and from the total at now, or says which refused
// it and how long until it would not. client must be the caller's own string.
func (s *Searcher) Admit(client string, now time.Time) (wait time.Duration, over Over) {
	if wait, ok := s.clients.allow(client, now); !ok {
		return wait, OverClient
	}
	if wait, ok := s.total.allow("", now); !ok {
		return wait, OverTotal
	}
	return 0, Within
}

// Missed reports whether a search found no worker holding id within MissTTL before now.
func (s *Searcher) Missed(id string, now time.Time) bool { return s.misses.has(id, now) }

// Query is one search.
type Query struct {
	// ID is the stored response looked for; the caller's own string.
	ID string
	// Candidates are the workers asked.
	Candidates []*workers.Worker
	// Deadline is the request's: no lookup runs past it.
	Deadline time.Time
	// Context ends the search when it is done (the client left); lookups still running are cut.
	Context context.Context
	// Lookup writes into out the lookup of ID on w: GET w's /v1/responses/{ID}, with the
	// credentials and headers the request itself would carry to w. It runs on the search's
	// goroutine, and out is the lookup's own.
	Lookup func(out *fasthttp.Request, w *workers.Worker)
	// Charge counts one lookup against the caller's limits, before it is sent; false ends the
	// search (Result.Refused).
	Charge func() bool
}

// Result is how a search ended.
type Result struct {
	Holder  *workers.Worker  // the worker that has the id; nil when none was found
	Failed  bool             // a lookup failed: a worker that may hold the id could not say
	Last    upstream.Failure // the last failed lookup's failure
	NotHere int              // the workers that answered 404
	Refused bool             // Charge refused a lookup
}

// lookupResult is one worker's answer to a lookup.
type lookupResult struct {
	w      *workers.Worker
	found  bool
	failed bool             // the worker could not say: it did not answer, or answered neither 2xx nor 404
	f      upstream.Failure // why, when failed; a kind when it counts as an upstream error
}

// Search asks q's candidates, least loaded first (a lookup is cheap, but a busy worker answers
// it last), whether they hold the id, Concurrency at a time, until one does or all have
// answered. The lookups run on goroutines of their own and touch nothing of the request: each
// gets its own copy of what it sends. All have ended when Search returns. A search that every
// candidate answered 404 is remembered as a miss.
func (s *Searcher) Search(q Query) Result {
	deadline := q.Deadline
	if t := s.pools.Options().Timeouts.Lookup; t > 0 && time.Until(deadline) > t {
		deadline = time.Now().Add(t)
	}
	candidates := slices.SortedStableFunc(slices.Values(q.Candidates), func(a, b *workers.Worker) int { return cmp.Compare(a.Load(), b.Load()) })
	results := make(chan lookupResult, len(candidates))
	var res Result
	var calls []*upstream.Call
	next, running := 0, 0
	defer func() {
		for _, c := range calls { // the search is over: lookups still running end at once
			c.Cut()
		}
		for ; running > 0; running-- {
			<-results
		}
	}()
	for res.Holder == nil {
		for running < s.opts.Concurrency && next < len(candidates) && q.Context.Err() == nil {
			if !q.Charge() {
				res.Refused = true
				return res
			}
			w := candidates[next]
			out := fasthttp.AcquireRequest()
			q.Lookup(out, w)
			call := &upstream.Call{Peer: w, Deadline: deadline, HeadersBy: deadline}
			calls = append(calls, call)
			next++
			running++
			go func() {
				defer fasthttp.ReleaseRequest(out)
				results <- s.lookup(out, w, call)
			}()
		}
		if running == 0 {
			break
		}
		select {
		case <-q.Context.Done():
			return res
		case r := <-results:
			running--
			switch {
			case r.found:
				res.Holder = r.w
			case !r.failed:
				res.NotHere++
			default:
				res.Failed, res.Last = true, r.f
				if r.f.Kind != "" {
					s.metrics.UpstreamErrors.WithLabelValues(r.f.Kind).Inc()
				}
			}
		}
	}
	if res.Holder == nil && !res.Failed && res.NotHere > 0 && res.NotHere == len(candidates) {
		s.misses.add(q.ID, time.Now()) // every candidate answered, and none has it
	}
	return res
}

// lookup sends one lookup on call and reads its answer's status: 2xx, the worker has the id;
// 404, it has not; anything else, or no answer by the call's deadline, it could not say.
func (s *Searcher) lookup(out *fasthttp.Request, w *workers.Worker, call *upstream.Call) lookupResult {
	pool, err := s.pools.Pool(w.URL())
	if err != nil {
		return lookupResult{w: w, failed: true, f: upstream.Failure{Kind: upstream.KindConnect, Message: "the worker's URL is not usable"}}
	}
	resp, c, f := pool.Send(out, call)
	if resp == nil {
		if f.Kind == upstream.KindFirstByte {
			f.Kind = upstream.KindTimeout // a lookup has one deadline, not a first-byte one
		}
		f.Message = "a worker did not answer the response's lookup: " + f.Message
		return lookupResult{w: w, failed: true, f: f}
	}
	status := resp.StatusCode()
	whole := resp.Header.ContentLength() != -2 && !resp.ConnectionClose()
	if body := resp.BodyStream(); body != nil && whole {
		n, err := io.CopyN(io.Discard, body, maxLookupBody+1)
		whole = err == io.EOF && n <= maxLookupBody
	}
	_ = resp.CloseBodyStream()
	call.Finish(c, resp, whole)
	switch {
	case status/100 == 2:
		return lookupResult{w: w, found: true}
	case status == http.StatusNotFound:
		return lookupResult{w: w}
	}
	f = upstream.Failure{Message: "a worker answered the response's lookup with " + strconv.Itoa(status)}
	if status >= 500 {
		f.Kind = upstream.KindStatus
	}
	return lookupResult{w: w, failed: true, f: f}
}
