package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/reqkey"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// exchange is one routed request on its way through the proxy.
type exchange struct {
	route    string
	start    time.Time
	firstOut time.Time // first response byte written to the client; zero until then
	status   int
}

// routed returns the handler of one routed endpoint: read and check the body, select, forward,
// retry while nothing has been sent, and count the outcome.
func (s *Server) routed(route string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		ex := &exchange{route: route, start: time.Now()}
		rid := r.Header.Get(HeaderRequestID)
		if rid == "" {
			rid = newRequestID()
		}
		w.Header().Set(HeaderRequestID, rid)
		s.forward(w, r, ex, rid)
		s.metrics.Requests.WithLabelValues(route, metrics.StatusClass(ex.status)).Inc()
		s.metrics.RequestDuration.WithLabelValues(route).Observe(time.Since(ex.start).Seconds())
		if !ex.firstOut.IsZero() {
			s.metrics.TimeToFirstByte.WithLabelValues(route).Observe(ex.firstOut.Sub(ex.start).Seconds())
		}
	}
}

func (s *Server) fail(w http.ResponseWriter, ex *exchange, status int, typ, code, msg string) {
	ex.status = status
	ex.firstOut = time.Now()
	writeError(w, status, typ, code, msg)
}

func (s *Server) forward(w http.ResponseWriter, r *http.Request, ex *exchange, rid string) {
	if r.ContentLength > s.opts.MaxPayloadSize {
		s.fail(w, ex, http.StatusRequestEntityTooLarge, "invalid_request_error", "payload_too_large",
			fmt.Sprintf("request body of %d bytes exceeds the limit of %d bytes", r.ContentLength, s.opts.MaxPayloadSize))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.opts.MaxPayloadSize))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			s.fail(w, ex, http.StatusRequestEntityTooLarge, "invalid_request_error", "payload_too_large",
				fmt.Sprintf("request body exceeds the limit of %d bytes", s.opts.MaxPayloadSize))
			return
		}
		ex.status = 499 // the client went away while sending
		return
	}
	req, err := reqkey.Parse(r.Header, body)
	if err != nil {
		s.fail(w, ex, http.StatusBadRequest, "invalid_request_error", "invalid_json", err.Error())
		return
	}
	candidates, known := s.pool.Candidates(req.Model)
	if !known {
		s.fail(w, ex, http.StatusNotFound, "invalid_request_error", "model_not_found",
			fmt.Sprintf("model %q is not served here; available models: %s", req.Model, strings.Join(s.pool.Models(), ", ")))
		return
	}

	ctx, cancel := context.WithTimeout(r.Context(), s.opts.RequestTimeout)
	defer cancel()
	backoff := s.opts.InitialBackoff
	var lastErr string
	for attempt := 0; ; attempt++ {
		if len(candidates) == 0 {
			if lastErr != "" {
				s.fail(w, ex, http.StatusBadGateway, "server_error", "upstream_unavailable", "no worker could serve the request: "+lastErr)
			} else {
				w.Header().Set(HeaderRetryAfter, "1")
				s.fail(w, ex, http.StatusServiceUnavailable, "server_error", "no_available_worker", "no healthy worker is available for this request")
			}
			return
		}
		dec := s.policy.Select(policy.Input{Context: ctx, Request: req, Candidates: candidates, All: s.pool.All()})
		chosen := dec.Worker
		candidates = without(candidates, chosen.URL())
		if !chosen.Breaker().Acquire() {
			attempt-- // another request took the half-open trial: not an attempt of ours
			continue
		}
		lease := chosen.Reserve()
		s.metrics.PolicyDecisions.WithLabelValues(s.policy.Name(), chosen.Tenant()).Inc()
		last := attempt >= s.opts.MaxRetries || len(candidates) == 0

		resp, err := s.send(ctx, r, body, chosen, rid)
		if err == nil && (last || !retryable(resp.StatusCode)) {
			s.respond(w, r, ex, resp, dec, lease)
			return
		}
		lease.Release()
		switch {
		case r.Context().Err() != nil: // the client went away: nothing to answer
			chosen.Breaker().Abandon()
			ex.status = 499
			return
		case err != nil && ctx.Err() != nil:
			chosen.Breaker().Record(false)
			s.metrics.UpstreamErrors.WithLabelValues(metrics.ErrTimeout).Inc()
			s.fail(w, ex, http.StatusGatewayTimeout, "server_error", "upstream_timeout",
				fmt.Sprintf("worker %s did not answer within %s", chosen.Tenant(), s.opts.RequestTimeout))
			return
		case err != nil:
			lastErr = err.Error()
			s.metrics.UpstreamErrors.WithLabelValues(metrics.ErrConnect).Inc()
		default:
			lastErr = fmt.Sprintf("worker %s answered %d", chosen.Tenant(), resp.StatusCode)
			drain(resp.Body)
			s.metrics.UpstreamErrors.WithLabelValues(metrics.ErrStatus).Inc()
		}
		chosen.Breaker().Record(false)
		s.log.Warn("upstream attempt failed", "request_id", rid, "worker", chosen.Tenant(), "attempt", attempt+1, "error", lastErr)
		if last {
			s.fail(w, ex, http.StatusBadGateway, "server_error", "upstream_unavailable", "no worker could serve the request: "+lastErr)
			return
		}
		s.metrics.Retries.Inc()
		if !sleep(ctx, jitter(backoff)) {
			ex.status = 499
			return
		}
		backoff = min(2*backoff, s.opts.MaxBackoff)
	}
}

// send forwards the original body bytes and the client's end-to-end headers to worker w.
func (s *Server) send(ctx context.Context, r *http.Request, body []byte, w *workers.Worker, rid string) (*http.Response, error) {
	target := w.URL() + r.URL.EscapedPath()
	if r.URL.RawQuery != "" {
		target += "?" + r.URL.RawQuery
	}
	out, err := http.NewRequestWithContext(ctx, r.Method, target, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	copyEndToEnd(out.Header, r.Header)
	out.Header.Del("Content-Length")
	out.ContentLength = int64(len(body))
	out.Header.Set(HeaderRequestID, rid)
	if w.Rank() >= 0 {
		out.Header.Set(HeaderDPRankOut, strconv.Itoa(w.Rank()))
	}
	if s.opts.APIKey != "" && out.Header.Get("Authorization") == "" {
		out.Header.Set("Authorization", "Bearer "+s.opts.APIKey)
	}
	return s.transport.RoundTrip(out)
}

// respond passes the worker's answer through: status, end-to-end headers, the router's headers,
// then the body as it arrives, flushed after every read so stream events are never held back.
// After the first byte a failure cannot be retried; the client connection is cut so the client
// sees a truncated response rather than a clean end.
func (s *Server) respond(w http.ResponseWriter, r *http.Request, ex *exchange, resp *http.Response, dec policy.Decision, lease *workers.Lease) {
	defer lease.Release()
	defer resp.Body.Close()
	worker := dec.Worker
	h := w.Header()
	copyEndToEnd(h, resp.Header)
	h.Set(HeaderWorker, worker.Tenant())
	h.Set(HeaderBaseWorker, worker.URL())
	if worker.Rank() >= 0 {
		h.Set(HeaderDPRank, strconv.Itoa(worker.Rank()))
	}
	h.Set(HeaderDecision, dec.Label)
	h.Set(HeaderPrefixMatch, strconv.FormatFloat(dec.Match, 'f', 4, 64))
	ex.status = resp.StatusCode
	s.metrics.Processed.WithLabelValues(worker.Tenant()).Inc()
	if s.policy.Name() == "cache_aware" {
		s.metrics.CacheAwareDecisions.WithLabelValues(dec.Label).Inc()
		s.metrics.PrefixMatchRatio.Observe(dec.Match)
	}
	w.WriteHeader(resp.StatusCode)

	rc := http.NewResponseController(w)
	_ = rc.Flush() // headers out now: a slow first token should not hide that the request was accepted
	bufp := copyBuffers.Get().(*[]byte)
	defer copyBuffers.Put(bufp)
	buf := *bufp
	for {
		n, rerr := resp.Body.Read(buf)
		if n > 0 {
			if ex.firstOut.IsZero() {
				ex.firstOut = time.Now()
			}
			if _, werr := w.Write(buf[:n]); werr != nil {
				worker.Breaker().Abandon()
				return // the client went away; the deferred close cancels upstream
			}
			_ = rc.Flush()
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			if r.Context().Err() != nil {
				worker.Breaker().Abandon()
				return
			}
			worker.Breaker().Record(false)
			s.metrics.UpstreamErrors.WithLabelValues(metrics.ErrMidStream).Inc()
			s.log.Warn("upstream response broke after the first byte", "worker", worker.Tenant(), "error", rerr)
			lease.Release()
			panic(http.ErrAbortHandler)
		}
	}
	if ex.firstOut.IsZero() {
		ex.firstOut = time.Now()
	}
	worker.Breaker().Record(resp.StatusCode < 500)
}

// copyBuffers recycles the response copy buffers: one per in-flight response otherwise.
var copyBuffers = sync.Pool{New: func() any { b := make([]byte, 32*1024); return &b }}

// retryable reports the worker answers that mean "try another worker": bad gateway, unavailable,
// gateway timeout. Every other status is the worker's real answer and passes through.
func retryable(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

func without(ws []*workers.Worker, url string) []*workers.Worker {
	out := make([]*workers.Worker, 0, len(ws))
	for _, w := range ws {
		if w.URL() != url {
			out = append(out, w)
		}
	}
	return out
}

func drain(body io.ReadCloser) {
	_, _ = io.Copy(io.Discard, io.LimitReader(body, 1<<16))
	_ = body.Close()
}

// sleep waits d or until ctx ends; it reports whether the full wait happened.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// jitter spreads retries of simultaneous failures: a uniform draw in [d/2, d].
func jitter(d time.Duration) time.Duration {
	if d <= 1 {
		return d
	}
	return d/2 + rand.N(d/2+1)
}

func newRequestID() string {
	return fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64())
}
