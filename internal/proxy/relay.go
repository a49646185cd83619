package proxy

import (
	"bytes"
	"io"
	"strconv"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/sniff"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// relay passes the worker's answer through: status, end-to-end headers and the router's headers
// at once (a slow first token must not hide that the request was accepted), then the body as it
// arrives, each piece flushed to the client as it is read, so stream events are never held back.
//
// A streamed body is written by fasthttp after the handler returns; the relay is its body
// stream, and fasthttp closes it when the write ends. Close is where the attempt ends (closed
// with its outcome, the policy told) and where the exchange's end is handed over: forward's
// deferred end leaves it to the relay once the stream is set. An answer read whole ends its
// attempt here, and the exchange when forward returns.
func (s *Server) relay(ctx *fasthttp.RequestCtx, ex *exchange, resp *fasthttp.Response, conn *upstream.Conn, dec policy.Decision, at *workers.Attempt) {
	worker := dec.Worker
	status := resp.StatusCode()
	ex.trace.Answered(status)
	s.metrics.Processed.WithLabelValues(worker.Name()).Inc()
	if s.labeled && ex.route.place == byPolicy {
		s.metrics.CacheAwareDecisions.WithLabelValues(dec.Label).Inc()
		s.metrics.PrefixMatchRatio.Observe(dec.Match)
	}
	size := resp.Header.ContentLength() // -1 chunked, -2 until the connection closes
	if resp.SkipBody {
		size = 0 // HEAD: the length is the GET answer's; no body follows
	}
	r := &relayBody{s: s, ex: ex, ctx: ctx, resp: resp, conn: conn, body: resp.BodyStream(), dec: dec, at: at, status: status, size: int64(size)}
	if s.opts.AccessLog != nil || (ex.route.place == byPolicy && status/100 == 2) {
		r.usage = sniff.NewUsage()
	}
	if ex.route.storesResponses && s.responses != nil && status/100 == 2 && !ex.in.Request.NoStore {
		r.sniff = sniff.NewResponseID(bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")))
	}
	if !ex.in.Request.Stream && size >= 0 && size <= maxBufferedAnswer {
		// A non-streamed answer of known, modest size is read whole now and sent with the
		// headers in one write; nothing waits on it in between.
		if err := readWhole(&ctx.Response, r, int64(size)); err != nil && r.upErr == nil {
			r.upErr = err
		}
		if r.upErr != nil {
			// Nothing has reached the client: it gets a clear 502 rather than an empty reply.
			// The answer was generated, so it is not retried elsewhere.
			ctx.Response.ResetBody()
			r.status = s.upstreamFailed(ctx, ex, upstream.Failure{Kind: upstream.KindMidStream, Message: "the worker's answer broke off before it was complete"})
			r.replaced = true
			r.relayed = int64(len(ctx.Response.Body()))
		} else {
			s.answerHeaders(ctx, resp, dec, status)
		}
		r.end(nil)
		r.extendWriteDeadline()
		return
	}
	s.answerHeaders(ctx, resp, dec, status)
	// The client must take each piece of the answer within the client write timeout, and the
	// whole of it by the request's deadline: a client that stops reading cannot hold the worker's
	// load, nor its admission slot, past either.
	r.extendWriteDeadline()
	ctx.Response.ImmediateHeaderFlush = true
	ex.handedOver = true
	ctx.Response.SetBodyStream(r, max(size, -1)) // relayed chunked unless its length is known
}

// readWhole appends size bytes read from r to dst's body, through a pooled buffer (io.CopyN took
// a new reader and buffer for every answer). It returns io.EOF when r ends before size bytes.
func readWhole(dst *fasthttp.Response, r io.Reader, size int64) error {
	buf := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(buf)
	for size > 0 {
		n, err := r.Read((*buf)[:min(int64(len(*buf)), size)])
		dst.AppendBody((*buf)[:n])
		size -= int64(n)
		switch {
		case err == io.EOF && size > 0:
			return io.EOF
		case err != nil && err != io.EOF:
			return err
		}
	}
	return nil
}

// copyBuffers are readWhole's buffers.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 16<<10); return &b }}

// answerHeaders gives the client the worker's status and end-to-end headers, and the router's
// headers that say who served the request and why.
func (s *Server) answerHeaders(ctx *fasthttp.RequestCtx, resp *fasthttp.Response, dec policy.Decision, status int) {
	h := &ctx.Response.Header
	copyResponseHeaders(h, &resp.Header)
	worker := dec.Worker
	h.Set(HeaderWorker, worker.Name())
	h.Set(HeaderBaseWorker, worker.BaseName())
	if worker.Rank() >= 0 {
		h.Set(HeaderDPRank, strconv.Itoa(worker.Rank()))
	}
	h.Set(HeaderDecision, dec.Label)
	h.Set(HeaderPrefixMatch, strconv.FormatFloat(dec.Match, 'f', 4, 64))
	setStatus(h, status) // a worker's 529 as well
}

// extendWriteDeadline gives the client at least the client write timeout, from now, to take what
// is written next; never past the request's deadline. fasthttp writes each piece the relay reads
// right after the read, so a deadline set at the end of each read bounds the time a client may
// accept no byte, not the time the worker takes to produce the next one. The deadline is set an
// eighth of the timeout further than needed and moved only once less than the timeout is left: a
// streamed answer reads once per token, and moving a deadline is a timer's update each time.
func (r *relayBody) extendWriteDeadline() {
	t := r.s.opts.ClientWriteTimeout
	if !r.writeBy.IsZero() && (r.writeBy.Equal(r.ex.deadline) || (t > 0 && time.Until(r.writeBy) >= t)) {
		return // the client has the timeout still, or the request's deadline, which comes first
	}
	d := r.ex.deadline
	if t > 0 {
		if soon := time.Now().Add(t + t/8); soon.Before(d) {
			d = soon
		}
	}
	r.writeBy = d
	_ = r.ctx.SetWriteDeadline(d)
}

// maxBufferedAnswer is the largest non-streamed answer read whole before it is sent.
const maxBufferedAnswer = 1 << 20

// relayBody is the client-side body stream of one relayed answer.
type relayBody struct {
	s      *Server
	ex     *exchange
	resp   *fasthttp.Response
	conn   *upstream.Conn
	body   io.Reader
	dec    policy.Decision
	at     *workers.Attempt
	status int
	size   int64             // the answer's Content-Length, or -1 (chunked), or -2 (until the connection closes)
	sniff  *sniff.ResponseID // looks for the id of the response the worker stored; nil when none is wanted
	usage  *sniff.Usage      // looks for the answer's token usage (cache check, access log); nil when none is wanted
	ctx    *fasthttp.RequestCtx
	// learned: the policy was told where the stored response lives, as soon as its id passed.
	learned bool

	relayed   int64
	firstByte time.Time
	upErr     error     // the worker's body broke off (not io.EOF)
	replaced  bool      // upErr came before any byte was sent: the client got the router's 502 instead
	writeBy   time.Time // the client write deadline last set
	eof       bool
	once      sync.Once
}

func (r *relayBody) Read(p []byte) (int, error) {
	if r.body == nil {
		return 0, io.EOF
	}
	n, err := r.body.Read(p)
	if n > 0 && r.firstByte.IsZero() {
		r.firstByte = time.Now()
		r.ex.trace.FirstByte()
		r.at.Prefilled() // the prefill is over: the tokens signal stops weighing it
		r.s.firstByte(r.ex, r.dec, r.firstByte)
	}
	r.relayed += int64(n)
	if r.usage != nil {
		r.usage.Feed(p[:n])
	}
	if r.sniff != nil && !r.learned {
		if r.sniff.Feed(p[:n]); r.sniff.Found() != "" {
			r.learned = true
			r.s.responses.ResponseStored(r.ex.in.Context, r.sniff.Found(), r.dec.Worker)
		}
	}
	r.extendWriteDeadline()
	switch {
	case err == io.EOF:
		r.eof = true
	case err != nil:
		// After the first byte nothing can be retried: returning the error makes fasthttp close
		// the client connection without ending the body, so the client sees a truncated answer
		// rather than a clean end.
		r.upErr = err
	}
	return n, err
}

// complete reports whether the whole answer was read from the worker.
func (r *relayBody) complete() bool { return r.eof || r.relayed == r.size }

// Close ends the exchange; fasthttp calls it once the body was written or could not be.
func (r *relayBody) Close() error { r.end(nil); return nil }

// CloseWithError is Close with the error of the write to the client, if any.
func (r *relayBody) CloseWithError(err error) error { r.end(err); return nil }

func (r *relayBody) end(writeErr error) {
	r.once.Do(func() {
		s, ex := r.s, r.ex
		outcome := workers.Succeeded
		class := ""
		ex.stopWatch() // before the verdict: a watch firing now would close a finished connection
		complete := r.complete()
		switch {
		case ex.gone.Load():
			// The watch saw the client leave and closed the worker connection.
			outcome, class = workers.Cancelled, metrics.StatusClass(statusClientGone)
		case r.upErr != nil:
			outcome = workers.Failed
			if !r.replaced {
				class = metrics.StatusCut
			}
			kind := upstream.KindMidStream
			if !time.Now().Before(ex.deadline) {
				kind = upstream.KindTimeout
			}
			s.metrics.UpstreamErrors.WithLabelValues(kind).Inc()
			s.log.Warn("upstream answer broke off after the first byte", "request_id", ex.rid, "worker", r.dec.Worker.Name(), "kind", kind)
		case writeErr != nil || !complete:
			// The client went away, or stopped reading past the client write timeout or the
			// request's deadline and was cut: no verdict on the worker.
			outcome = workers.Cancelled
			// fasthttp closes the body with Close before CloseWithError, so the write's error
			// may not be known here: a deadline that has passed tells a timed-out write.
			if now := time.Now(); now.Before(ex.deadline) && now.Before(r.writeBy) && !upstream.IsTimeout(writeErr) {
				class = metrics.StatusClass(statusClientGone)
			} else {
				class = metrics.StatusCut
				s.log.Info("client cut: it took no byte of its answer in time", "request_id", ex.rid, "worker", r.dec.Worker.Name())
			}
		case r.status >= 500:
			outcome = workers.Failed
		}
		// A connection whose answer was read to its end goes back to the pool; any other is closed,
		// which is how a worker learns to stop generating for a client that left.
		ex.call.Finish(r.conn, r.resp, complete && writeErr == nil && r.upErr == nil && !ex.gone.Load() && r.size != -2)
		r.at.Close(outcome)
		var u sniff.Tokens
		if r.usage != nil {
			u = r.usage.Result()
		}
		var reported policy.Usage
		if outcome == workers.Succeeded && r.status/100 == 2 {
			s.learn(ex, r)
			reported = s.checkCache(ex, r.dec, u)
		}
		if s.done(ex, r.dec, outcome, reported) {
			s.metrics.CacheCorrections.WithLabelValues(r.dec.Worker.Name()).Inc()
		}
		if r.firstByte.IsZero() && r.complete() {
			r.firstByte = time.Now() // an empty body: its end is its first byte
		}
		r.usage.Release()
		r.usage = nil
		ex.status, ex.class, ex.firstByte, ex.sent, ex.usage = r.status, class, r.firstByte, r.relayed, u
		if r.upErr != nil {
			ex.err = r.upErr.Error()
		}
		if ex.handedOver {
			s.end(r.ctx, ex)
		}
	})
}

// firstByte tells the policy a streamed answer's time to first token (a non-streamed answer's
// first byte is its end), and counts it beside the time the policy predicted.
func (s *Server) firstByte(ex *exchange, dec policy.Decision, at time.Time) {
	if !ex.in.Request.Stream || ex.route.place != byPolicy || ex.sentAt.IsZero() {
		return
	}
	ttft := at.Sub(ex.sentAt)
	s.policy.FirstByte(ex.in, dec, ttft)
	if dec.TTFT > 0 {
		worker := dec.Worker.Name()
		s.metrics.TTFTPredicted.WithLabelValues(worker).Add(dec.TTFT.Seconds())
		s.metrics.TTFTAchieved.WithLabelValues(worker).Add(ttft.Seconds())
	}
}

// checkCache counts the cached tokens the worker reported against what the policy predicted,
// and returns the usage as the policy's Done hears it: the prompt and output when the answer
// said, and the cached tokens (Known) when it also said what it served from cache.
func (s *Server) checkCache(ex *exchange, dec policy.Decision, u sniff.Tokens) policy.Usage {
	if !u.OK || ex.route.place != byPolicy || u.Prompt <= 0 {
		return policy.Usage{}
	}
	if !u.CachedKnown {
		return policy.Usage{Prompt: u.Prompt, Output: u.Output}
	}
	worker := dec.Worker.Name()
	s.metrics.PromptTokens.WithLabelValues(worker, dec.Label).Add(float64(u.Prompt))
	s.metrics.CachedTokensPredicted.WithLabelValues(worker, dec.Label).Add(dec.PredictedCached(u.Prompt))
	s.metrics.CachedTokensAchieved.WithLabelValues(worker, dec.Label).Add(float64(u.Cached))
	return policy.Usage{Known: true, Prompt: u.Prompt, Cached: u.Cached, Output: u.Output}
}

// learn tells the policy where a stored response lives, from an answer that succeeded: the
// response a POST /v1/responses stored, or the one a DELETE removed. (The holder a search found
// was told when it was found.)
func (s *Server) learn(ex *exchange, r *relayBody) {
	if s.responses == nil {
		return
	}
	ctx := ex.in.Context
	switch {
	case r.sniff != nil:
		if id := r.sniff.Result(); id != "" && !r.learned {
			r.learned = true
			s.responses.ResponseStored(ctx, id, r.dec.Worker)
		}
	case ex.responseID == "":
	case ex.method == "DELETE":
		s.responses.ResponseDeleted(ctx, ex.responseID)
	}
}
