package proxy

import (
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/sniff"
	"github.com/cacheroute/cacheroute/internal/telemetry"
)

// logAccess writes the access log entry of a request that ended (when the log is on): status
// and class as requests_total counts them, the worker and decision of the last attempt, the
// bytes relayed, and the prompt and cached tokens when the answer reported its usage.
func (s *Server) logAccess(ctx *fasthttp.RequestCtx, ex *exchange, status int, class string, firstByte time.Time, out int64, u sniff.Tokens) {
	if s.opts.AccessLog == nil {
		return
	}
	e := telemetry.Entry{
		Time: ex.start, RequestID: ex.rid, Route: ex.route.path, Method: ex.method, Tenant: ex.caller.Tenant,
		Decision: ex.decision, Worker: ex.worker, Status: status, StatusClass: class, Attempts: ex.attempts,
		Seconds: time.Since(ex.start).Seconds(), BytesIn: len(ex.body.Bytes()), BytesOut: out,
	}
	if ex.pd != nil {
		e.PD = ex.pd.path
		if ex.pd.body != nil {
			e.PrefillWorker = ex.pd.prefill
		}
	}
	if req := ex.in.Request; req != nil {
		e.Model, e.Session = truncate(req.Model, maxShownModel), telemetry.SessionHash(req.SessionKey)
	}
	if !firstByte.IsZero() {
		e.TTFBSeconds = firstByte.Sub(ex.start).Seconds()
	}
	if u.OK {
		e.PromptTokens = &u.Prompt
	}
	if u.CachedKnown {
		e.CachedTokens = &u.Cached
	}
	s.opts.AccessLog.Log(e)
}
