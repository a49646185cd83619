package proxy

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/bodies"
	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/sniff"
	"github.com/cacheroute/cacheroute/internal/telemetry"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// exchange is one routed request on its way through the proxy.
type exchange struct {
	route    *route
	start    time.Time
	deadline time.Time // --request-timeout-secs after start: the whole exchange, stream included
	// headersBy is when the first attempt's --first-byte-timeout-secs ends: the one deadline of
	// every attempt for the worker's response headers, streamed or not (never after deadline).
	headersBy time.Time
	rid       string
	in        policy.Input
	prompt    policy.PromptMemo // the request's prompt tokens once a policy asked them (in.Prompt)
	// responseID is the stored response a byResponseID path names; label and searching say how
	// its worker is found: the known holder, or a search of the healthy workers (search.go).
	responseID string
	caller     clientkeys.Client // who sent it, when client keys are checked
	// attempts, decision and worker describe the last attempt, for the access log.
	attempts         int
	decision, worker string
	method           string
	label            string
	searching        bool
	follow           *workers.Worker         // the holder a search found of the response a turn continues; its first attempt goes there
	pd               *pdState                // a request prefilled and decoded apart (pd.go); nil otherwise
	req              requestLeg              // the request in the attempt loop
	match            float64                 // the last attempt's predicted prefix match
	trace            *telemetry.RequestTrace // nil when tracing is off

	client net.Conn      // the client's connection
	call   upstream.Call // the call to the worker of the current attempt, for the watch to cut
	gone   atomic.Bool   // the watch saw the client leave
	done   atomic.Bool   // the exchange ended: the watch must not re-arm
	// cancelWait ends the request's wait for admission; the watch calls it when the client left.
	cancelWait atomic.Pointer[context.CancelFunc]
	permit     *admission.Permit // the request's place under the concurrency limits, if any
	// held is the request's place among the sessions waiting for KV room in heldIn, once the
	// policy held it; given up when it is placed.
	held   *admission.SessionTicket
	heldIn *admission.SessionQueue
	sentAt time.Time // when the last attempt was sent, for its time to first byte
	watch  atomic.Pointer[time.Timer]

	// The result, for the exchange's end: the status sent (or statusClientGone), its class when
	// it is not the status's own (a cut answer), when its first byte went out (zero: none did),
	// the body bytes sent, the usage the answer reported, and the worker's error, if any.
	status    int
	class     string
	firstByte time.Time
	sent      int64
	usage     sniff.Tokens
	err       string
	// handedOver: the relay streams the answer after forward returns; its body's Close ends the
	// exchange instead.
	handedOver bool
	ended      bool
	// body is the request's body, which the exchange holds until its end (package bodies).
	body *bodies.Body
}

// end ends the exchange, once, on every path: the client watch stops, the admission place and
// the body are given back, and the request is counted, logged and its trace ended with the recorded result.
// forward defers it; when the relay takes the answer over, the relay's Close calls it.
func (s *Server) end(ctx *fasthttp.RequestCtx, ex *exchange) {
	if ex.ended {
		return
	}
	ex.ended = true
	ex.stopWatch()
	ex.release()
	ex.unhold()
	class := ex.class
	if class == "" {
		class = metrics.StatusClass(ex.status)
	}
	ex.route.count(ex.start, class, ex.firstByte)
	if ex.pd != nil && ex.pd.path != "" {
		s.metrics.PDRequests.WithLabelValues(ex.pd.path).Inc()
	}
	s.logAccess(ctx, ex, ex.status, class, ex.firstByte, ex.sent, ex.usage)
	ex.trace.End(telemetry.Outcome{Status: ex.status, StatusClass: class, Attempts: ex.attempts, Decision: ex.decision,
		Worker: ex.worker, Match: ex.match, Bytes: ex.sent, Err: ex.err})
	ex.body.Release()
}

// clientWatchInterval is how often a running exchange checks whether its client went away. A
// client that leaves is otherwise noticed only at the next write to it, which for a non-streamed
// answer comes after the whole generation: the watch closes the worker connection instead, and
// vLLM stops generating for a request whose connection closed.
const clientWatchInterval = 250 * time.Millisecond

// startWatch arms the client watch; it costs one timer per request, and one non-blocking
// socket peek per interval only for requests that run that long.
func (ex *exchange) startWatch() {
	ex.watch.Store(time.AfterFunc(clientWatchInterval, ex.check))
}

// check runs on the timer's goroutine: it re-arms the watch while the client is there, and closes
// the worker connection once it is gone. It re-arms with a new timer rather than resetting the
// current one, whose field startWatch may not have written yet; a timer that stopWatch missed
// fires once more, sees the exchange done, and ends.
func (ex *exchange) check() {
	if ex.done.Load() {
		return
	}
	if !upstream.PeerClosed(ex.client) {
		ex.watch.Store(time.AfterFunc(clientWatchInterval, ex.check))
		return
	}
	ex.gone.Store(true)
	if cancel := ex.cancelWait.Load(); cancel != nil {
		(*cancel)()
	}
	ex.call.Cut()
}

// watchWait lets the client watch end a wait done for the request (admission, a hold for KV
// room, a response search) through its cancel stop, at once when the client has left already.
// The func it returns, deferred by the waiter, takes the wait from the watch and ends it.
func (ex *exchange) watchWait(stop context.CancelFunc) func() {
	ex.cancelWait.Store(&stop)
	if ex.gone.Load() {
		stop()
	}
	return func() {
		ex.cancelWait.Store(nil)
		stop()
	}
}

func (ex *exchange) stopWatch() {
	ex.done.Store(true)
	if t := ex.watch.Load(); t != nil {
		t.Stop()
	}
}

// forward runs one routed request: read it, find its candidates, admit it, find the stored
// response it names if need be, and send it through the attempt loop, whose last attempt relays
// the answer. id is the response id a byResponseID path names; body is the request's body,
// which the exchange holds until its end.
func (s *Server) forward(ctx *fasthttp.RequestCtx, rt *route, id string, body *bodies.Body) {
	body.Hold()
	ex := &exchange{route: rt, start: time.Now(), client: ctx.Conn(), responseID: id, method: string(ctx.Method()), body: body}
	ex.deadline = ex.start.Add(s.opts.Upstream.Timeouts.Request)
	ex.headersBy = ex.deadline
	ex.rid = requestID(ctx.Request.Header.Peek(HeaderRequestID))
	ctx.Response.Header.Set(HeaderRequestID, ex.rid)
	ex.trace = s.opts.Tracer.Start(&ctx.Request.Header, ex.method, rt.path, ex.rid, ex.start)
	defer func() {
		// The body is the server's memory for the handler: every Select, the one hook that reads
		// it, ran by now; a policy's hooks after (Done, at a streamed answer's end) see none.
		ex.in.Body = nil
		if !ex.handedOver {
			s.end(ctx, ex)
		}
	}()

	if !s.identify(ctx, ex) {
		return
	}
	var ok bool
	if rt.place == byResponseID {
		ok = s.prepareByResponseID(ctx, ex)
	} else {
		ok = s.prepareByPolicy(ctx, ex)
	}
	if !ok {
		return
	}
	if s.opts.PD != nil && rt.place == byPolicy {
		s.pdCandidates(ex)
	}
	ex.startWatch()
	if s.opts.Admission != nil && len(ex.in.Candidates) > 0 && !s.admit(ctx, ex) {
		return
	}
	if len(ex.in.Candidates) > 0 && !s.findResponse(ctx, ex) {
		ex.stopWatch()
		return
	}

	ex.req = requestLeg{s: s, ctx: ctx, ex: ex}
	switch end, dec, last := s.attempts(ex, &ex.req); end {
	case legRefused:
		s.refuse(ctx, ex, dec)
	case legNoWorker:
		s.finish(ctx, ex, s.noWorker(ctx, ex, last))
	case legFailed:
		s.finish(ctx, ex, s.upstreamFailed(ctx, ex, last))
	case legClientGone:
		s.finish(ctx, ex, statusClientGone)
	}
}

// leg is what the attempt loop sends to one worker at a time: the request itself (requestLeg),
// or the prefill leg of a request prefilled and decoded apart (prefillLeg, pd.go). Each leg has
// its own policy and candidates, and takes its answers its own way; the loop is the same.
type leg interface {
	// input is the leg's policy input; the loop takes each worker it tries off its candidates.
	input() *policy.Input
	// choose decides the next attempt among the candidates.
	choose() policy.Decision
	// hold waits as the policy's Hold says, and reports whether to choose again; false when the
	// client left, or when the leg does not wait (the loop then ends it as refused).
	hold(h *policy.Hold) bool
	// accepted records that attempt n carries dec out (the breaker granted it, the load is
	// counted): the policy learns it.
	accepted(dec policy.Decision, n int)
	// send sends the leg to dec's worker and takes the answer. It reports true when the answer
	// ends the leg, having taken over at (closed once the answer is done with), else how the
	// attempt failed: final says that no other attempt follows whatever the answer.
	send(dec policy.Decision, at *workers.Attempt, final bool) (bool, upstream.Failure)
	// ended tells how attempt n on dec ended without an answer taken: cancelled (the client
	// left), or failed with f, after which the loop tries again when retry.
	ended(dec policy.Decision, o workers.Outcome, f upstream.Failure, n int, retry bool)
}

// legEnd is how a leg's attempt loop ended.
type legEnd uint8

const (
	legAnswered   legEnd = iota // an answer ended it: relayed, or read
	legRefused                  // the policy places it nowhere
	legNoWorker                 // no candidate was left to try
	legFailed                   // the last attempt failed, and no other may follow
	legClientGone               // the client left
)

// attempts is the attempt loop, the one way any request, or any leg of one, reaches a worker:
// choose a worker (the leg's policy), take an attempt on it (its breaker and its load: a refused
// worker is left out and another chosen), send, and again on another worker while the failure
// provably started nothing, within --retry-max-retries and the request's first-byte deadline,
// with a growing backoff in between. It returns how the leg ended, with the last decision (the
// refusal, when the policy refused) and the last failure.
func (s *Server) attempts(ex *exchange, l leg) (legEnd, policy.Decision, upstream.Failure) {
	in := l.input()
	backoff := s.opts.InitialBackoff
	var last upstream.Failure
	for n := 0; ; {
		// A worker found stalled since the request began (by another request's missed first
		// byte, or the stall checks) is not tried: the attempt would only wait to fail.
		in.Candidates = withoutStalled(in.Candidates)
		if len(in.Candidates) == 0 {
			return legNoWorker, policy.Decision{}, last
		}
		dec := l.choose()
		if dec.Refusal != nil {
			return legRefused, dec, last
		}
		if dec.Hold != nil {
			if l.hold(dec.Hold) {
				continue // choose again: room may have appeared, or the wait is over
			}
			if ex.gone.Load() {
				return legClientGone, dec, last
			}
			return legRefused, dec, last
		}
		in.Candidates = without(in.Candidates, dec.Worker.URL())
		at := s.pool.Acquire(dec.Worker)
		if at == nil {
			continue // the breaker refused (its half-open trial is taken): choose again without it
		}
		at.Prefill(dec.Prefill)
		n++
		l.accepted(dec, n)
		final := len(in.Candidates) == 0 || n > s.opts.MaxRetries
		answered, f := l.send(dec, at, final)
		if answered {
			return legAnswered, dec, f
		}
		if ex.gone.Load() {
			at.Close(workers.Cancelled)
			l.ended(dec, workers.Cancelled, f, n, false)
			return legClientGone, dec, f
		}
		if f.Kind == upstream.KindFirstByte && at.MissedFirstByte(s.opts.Upstream.Timeouts.FirstByte) {
			s.log.Warn("worker stalled: no byte of any answer within the first-byte timeout; out of rotation until it answers a probe request",
				"worker", dec.Worker.Name())
		}
		at.Close(workers.Failed)
		if f.Kind != "" {
			s.metrics.UpstreamErrors.WithLabelValues(f.Kind).Inc()
		}
		last = f
		retry := f.Retryable && !final && time.Now().Before(ex.headersBy)
		l.ended(dec, workers.Failed, f, n, retry)
		if !retry {
			return legFailed, dec, f
		}
		if !sleep(ex, jitter(backoff)) {
			return legClientGone, dec, f
		}
		backoff = min(2*backoff, s.opts.MaxBackoff)
	}
}

// requestLeg is the request itself in the attempt loop: placed by the server's policy (or at the
// holder of the response its path names), each attempt recorded for the access log and the
// trace, its answer relayed.
type requestLeg struct {
	s   *Server
	ctx *fasthttp.RequestCtx
	ex  *exchange
}

func (l *requestLeg) input() *policy.Input { return &l.ex.in }

func (l *requestLeg) choose() policy.Decision { return l.s.choose(l.ex) }

func (l *requestLeg) hold(h *policy.Hold) bool { return l.s.hold(l.ex, h) }

func (l *requestLeg) accepted(dec policy.Decision, n int) {
	s, ex := l.s, l.ex
	if ex.route.place == byPolicy {
		s.policy.Accepted(ex.in, dec)
		ex.unhold()
		s.metrics.PolicyDecisions.WithLabelValues(s.policy.Name(), dec.Worker.Name()).Inc()
	}
	if n == 1 {
		// The first-byte timeout runs from the first attempt, once admission, any search and
		// any wait for KV room are done, and every attempt (a P/D request's prefill leg's too)
		// waits within it: a fleet of hung workers costs one timeout, not one per attempt.
		if fb := s.opts.Upstream.Timeouts.FirstByte; fb > 0 {
			if t := time.Now().Add(fb); t.Before(ex.headersBy) {
				ex.headersBy = t
			}
		}
	}
	ex.attempts, ex.decision, ex.worker, ex.match = n, dec.Label, dec.Worker.Name(), dec.Match
	ex.trace.Attempt(n, ex.worker)
}

// send sends the request (a P/D request's decode leg, once its prefill leg ran: decidePD) and
// relays the answer: anything but a retryable 5xx, or any answer on the final attempt.
func (l *requestLeg) send(dec policy.Decision, at *workers.Attempt, final bool) (bool, upstream.Failure) {
	s, ctx, ex := l.s, l.ctx, l.ex
	var body []byte // the client's
	if ex.pd != nil {
		if ex.pd.path == "" {
			s.decidePD(ctx, ex, dec)
		}
		body = ex.pd.body
	}
	ex.sentAt = time.Now()
	resp, conn, f := s.send(ctx, ex, dec.Worker, body)
	if resp == nil {
		return false, f
	}
	if status := resp.StatusCode(); !final && (upstream.RetryableStatus(status) || ex.pd.pullFailed(status)) {
		// An answer that will not be relayed is dropped with its connection: reading a 5xx body
		// to its end to keep the connection is not worth waiting on a failing worker.
		ex.call.Finish(conn, resp, false)
		return false, upstream.Failure{Kind: upstream.KindStatus, Retryable: true, Message: "the worker answered " + strconv.Itoa(status)}
	}
	if ex.pd != nil {
		ctx.Response.Header.Set(HeaderPD, ex.pd.path)
		if ex.pd.body != nil {
			ctx.Response.Header.Set(HeaderPrefillWorker, ex.pd.prefill)
		}
	}
	s.relay(ctx, ex, resp, conn, dec, at)
	return true, f
}

func (l *requestLeg) ended(dec policy.Decision, o workers.Outcome, f upstream.Failure, n int, retry bool) {
	s, ex := l.s, l.ex
	if o == workers.Failed {
		ex.pdFailed(f)
		ex.trace.AttemptFailed(f.Kind, f.Message)
		s.log.Warn("upstream attempt failed", "request_id", ex.rid, "worker", dec.Worker.Name(), "attempt", n, "kind", f.Kind)
	}
	s.done(ex, dec, o, policy.Usage{})
	if retry {
		s.metrics.Retries.Inc()
	}
}

// identify tells the caller by its client key, when client keys are checked; it answers 401 and
// reports false for a caller without a valid one.
func (s *Server) identify(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	if s.opts.ClientKeys == nil {
		return true
	}
	key := clientkeys.FromHeaders(func(name string) string { return string(ctx.Request.Header.Peek(name)) })
	client, ok := s.opts.ClientKeys.Lookup(key)
	if !ok {
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusUnauthorized, "invalid_request_error", "invalid_api_key",
			"a valid API key is required: send it as 'Authorization: Bearer <key>' or 'x-api-key: <key>'"))
		return false
	}
	ex.caller = client
	s.metrics.TenantRequests.WithLabelValues(client.Tenant).Inc()
	return true
}

// prepareByPolicy reads the body by the route's protocol and finds the workers serving its
// model; it answers the request itself and reports false when there is nothing to route.
func (s *Server) prepareByPolicy(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	req, err := ex.route.read(bodyHeaders{requestHeaders{&ctx.Request.Header}, ex.body}, ctx.PostBody())
	if err != nil {
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusBadRequest, "invalid_request_error", "invalid_json", err.Error()))
		return false
	}
	candidates, served, ok := s.candidates(req.Model)
	if !ok {
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusNotFound, "invalid_request_error", "model_not_found",
			fmt.Sprintf("model %q is not served here; available models: %s", truncate(req.Model, 200), strings.Join(s.pool.Models(), ", "))))
		return false
	}
	ex.body.Derived(len(req.Text)) // the history key or routing text: the copy the body counted
	// The route's path and the body are what a policy's tokenizer asks the prompt's tokens with
	// (policy.Input.PromptTokens); ex.prompt remembers them, so that the request is tokenized at
	// most once however many times it is chosen for.
	ex.in = policy.Input{Context: context.Background(), Request: req, Model: served, Candidates: candidates, All: s.pool.All(),
		Size: len(ctx.PostBody()), Path: ex.route.path, Body: ctx.PostBody(), Prompt: &ex.prompt}
	ex.trace.Request(truncate(req.Model, maxShownModel), req.SessionKey)
	return true
}

// Labels of the requests that name a stored response in their path. They are not the policy's
// decisions, so they are given in the decision header only.
const (
	labelResponseHolder = "response_id_holder" // the worker that stored the response
	labelResponseSearch = "response_id_search" // unknown id: the workers were searched for it (search.go)
	labelResponseMiss   = "response_id_miss"   // an id no worker had moments ago: 404 at once, no worker asked
)

// prepareByResponseID finds the worker holding the response the path names: the one the policy
// knows stored it, else the one a search of the healthy workers finds (findResponse, once the
// request is admitted).
func (s *Server) prepareByResponseID(ctx *fasthttp.RequestCtx, ex *exchange) bool {
	req := &protocol.Request{Stream: string(ctx.QueryArgs().Peek("stream")) == "true"}
	candidates, _, _ := s.pool.Candidates("")
	ex.in = policy.Input{Context: context.Background(), Request: req, Candidates: candidates, All: s.pool.All(), Size: len(ctx.PostBody())}
	if s.responses != nil {
		if tenant, ok := s.responses.ResponseHolder(ex.in.Context, ex.responseID); ok {
			ex.label = labelResponseHolder
			ex.in.Candidates = nil
			for _, w := range candidates {
				if w.ID() == tenant {
					ex.in.Candidates = []*workers.Worker{w}
				}
			}
			if len(ex.in.Candidates) == 0 {
				s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusNotFound, "invalid_request_error", "response_not_found",
					"Response with id '"+truncate(ex.responseID, 200)+"' not found: the worker that stored it is not available."))
				return false
			}
			return true
		}
	}
	if s.search.Missed(ex.responseID, ex.start) {
		ex.label = labelResponseMiss
		ctx.Response.Header.Set(HeaderDecision, labelResponseMiss)
		s.finish(ctx, ex, s.fail(ctx, ex, fasthttp.StatusNotFound, "invalid_request_error", "response_not_found",
			"Response with id '"+truncate(ex.responseID, 200)+"' not found."))
		return false
	}
	ex.label, ex.searching = labelResponseSearch, true
	return true
}

// choose is the worker the next attempt goes to: the policy's choice, or the worker holding the
// response a path names. A turn whose previous response a search found goes to its holder first;
// should that attempt fail, the policy knows the holder from then on and answers for it.
func (s *Server) choose(ex *exchange) policy.Decision {
	if ex.route.place == byPolicy {
		if w := ex.follow; w != nil {
			ex.follow = nil
			return policy.Decision{Worker: w, Label: labelResponseSearch}
		}
		return s.policy.Select(ex.in)
	}
	return ex.in.Pick(ex.in.Candidates[0], ex.label)
}

// done tells the policy how an attempt it placed ended, and reports whether it corrected its
// model of the worker from the answer's usage.
func (s *Server) done(ex *exchange, dec policy.Decision, o workers.Outcome, u policy.Usage) bool {
	return ex.route.place == byPolicy && s.policy.Done(ex.in, dec, o, u)
}

// refuse answers a request the policy would place nowhere, with the policy's label.
func (s *Server) refuse(ctx *fasthttp.RequestCtx, ex *exchange, dec policy.Decision) {
	ex.decision = dec.Label
	ctx.Response.Header.Set(HeaderDecision, dec.Label)
	if s.labeled {
		s.metrics.CacheAwareDecisions.WithLabelValues(dec.Label).Inc()
	}
	r := dec.Refusal
	typ := "invalid_request_error"
	if r.Status >= 500 {
		typ = "server_error"
		ctx.Response.Header.Set(HeaderRetryAfter, "1")
	}
	s.finish(ctx, ex, s.fail(ctx, ex, r.Status, typ, r.Code, r.Message))
}

// errorWriteTimeout bounds the write of an answer the router makes itself.
const errorWriteTimeout = 10 * time.Second

// statusClientGone is the status recorded for requests whose client left before any answer
// (nginx's 499).
const statusClientGone = 499

// send sends the request to w, with body in place of the client's when set (a P/D leg's), on a
// connection the client watch can cut (upstream.Pool.Send). It returns the worker's answer, with
// its body still to be read from conn, or how the attempt failed.
func (s *Server) send(ctx *fasthttp.RequestCtx, ex *exchange, w *workers.Worker, body []byte) (*fasthttp.Response, *upstream.Conn, upstream.Failure) {
	pool, err := s.upstreams.Pool(w.URL())
	if err != nil {
		return nil, nil, upstream.Failure{Kind: upstream.KindConnect, Retryable: true, Message: "the worker's URL is not usable"}
	}
	out := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(out)
	s.buildRequest(ctx, out, w, ex.rid, pool.Target.Authorization)
	if body != nil {
		out.SetBodyRaw(body)
	}
	ex.trace.Inject(&out.Header)
	ex.call.Peer, ex.call.Deadline, ex.call.HeadersBy, ex.call.CheckStall = w, ex.deadline, ex.headersBy, true
	return pool.Send(out, &ex.call)
}

// buildRequest writes the upstream request: the client's method, path, query and body bytes as
// they came, its end-to-end headers, and the router's own; auth is the worker's credential
// (upstream.Dialer.Authorization), sent when the client's own is not.
func (s *Server) buildRequest(ctx *fasthttp.RequestCtx, out *fasthttp.Request, w *workers.Worker, rid, auth string) {
	in := &ctx.Request
	copyRequestHeaders(&out.Header, &in.Header)
	if s.opts.ClientKeys != nil && !s.opts.ForwardClientAuth {
		out.Header.Del("Authorization") // the client's key is the router's business, not the worker's
		out.Header.Del("X-Api-Key")
	}
	out.Header.SetMethodBytes(in.Header.Method())
	out.SetRequestURI(w.URL() + string(in.RequestURI()))
	out.SetBodyRaw(in.Body())
	out.Header.Set(HeaderRequestID, rid)
	if w.Rank() >= 0 {
		out.Header.Set(HeaderDPRankOut, strconv.Itoa(w.Rank()))
	}
	if auth != "" && len(out.Header.Peek("Authorization")) == 0 && len(out.Header.Peek("X-Api-Key")) == 0 {
		out.Header.Set("Authorization", auth)
	}
	addForwarded(&out.Header, ctx)
}

// noWorker answers when no candidate is left: 502 after failed attempts, else 503.
func (s *Server) noWorker(ctx *fasthttp.RequestCtx, ex *exchange, last upstream.Failure) int {
	if last.Kind != "" {
		return s.upstreamFailed(ctx, ex, last)
	}
	ctx.Response.Header.Set(HeaderRetryAfter, "1")
	return s.fail(ctx, ex, fasthttp.StatusServiceUnavailable, "server_error", "no_available_worker", "no healthy worker is available for this request")
}

// upstreamFailed answers the last failure: 504 when the worker ran out of time, else 502. The
// message says what happened without naming any socket address.
func (s *Server) upstreamFailed(ctx *fasthttp.RequestCtx, ex *exchange, f upstream.Failure) int {
	if f.Kind == upstream.KindTimeout || f.Kind == upstream.KindFirstByte {
		return s.fail(ctx, ex, fasthttp.StatusGatewayTimeout, "server_error", "upstream_timeout", "no worker could serve the request: "+f.Message)
	}
	return s.fail(ctx, ex, fasthttp.StatusBadGateway, "server_error", "upstream_unavailable", "no worker could serve the request: "+f.Message)
}

// fail answers the request with an error in its route's shape and returns the status sent.
func (s *Server) fail(ctx *fasthttp.RequestCtx, ex *exchange, status int, typ, code, msg string) int {
	_ = ctx.SetWriteDeadline(time.Now().Add(errorWriteTimeout))
	return writeFastError(ctx, ex.route.errors, status, typ, code, msg)
}

// finish records the answer the router gave itself (no worker's answer was relayed) as the
// exchange's result; the exchange ends when forward returns.
func (s *Server) finish(ctx *fasthttp.RequestCtx, ex *exchange, status int) {
	ex.status, ex.class, ex.sent = status, "", int64(len(ctx.Response.Body()))
	if status != statusClientGone {
		ex.firstByte = time.Now() // the router's own answer is the first byte
	}
}

// sleep waits d before a retry, bounded by the request's first-byte deadline; it reports false
// when the client went away meanwhile.
func sleep(ex *exchange, d time.Duration) bool {
	if left := time.Until(ex.headersBy); d > left {
		d = max(left, 0)
	}
	time.Sleep(d)
	return !ex.gone.Load() && !upstream.PeerClosed(ex.client)
}

// without returns ws minus every tenant of url (all ranks share one worker process).
func without(ws []*workers.Worker, url string) []*workers.Worker {
	out := make([]*workers.Worker, 0, len(ws))
	for _, w := range ws {
		if w.URL() != url {
			out = append(out, w)
		}
	}
	return out
}

// withoutStalled returns ws, or a copy of it without the workers found stalled.
func withoutStalled(ws []*workers.Worker) []*workers.Worker {
	if !slices.ContainsFunc(ws, (*workers.Worker).Stalled) {
		return ws
	}
	out := make([]*workers.Worker, 0, len(ws))
	for _, w := range ws {
		if !w.Stalled() {
			out = append(out, w)
		}
	}
	return out
}

// jitter spreads retries of simultaneous failures: a uniform draw in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

// MaxRequestIDLen is the longest x-request-id the router echoes.
const MaxRequestIDLen = 128

// requestID returns the client's x-request-id when it is at most MaxRequestIDLen visible ASCII
// characters, else a new random one.
func requestID(given []byte) string {
	if len(given) > 0 && len(given) <= MaxRequestIDLen {
		ok := true
		for _, c := range given {
			if c < 0x21 || c > 0x7e {
				ok = false
				break
			}
		}
		if ok {
			return string(given)
		}
	}
	return newRequestID()
}

func newRequestID() string {
	var b [32]byte
	const hex = "0123456789abcdef"
	x, y := rand.Uint64(), rand.Uint64()
	for i := range 16 {
		b[i] = hex[(x>>(60-4*i))&0xf]
		b[16+i] = hex[(y>>(60-4*i))&0xf]
	}
	return string(b[:])
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }
