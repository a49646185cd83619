package proxy

import (
	"slices"
	"strings"

	"github.com/valyala/fasthttp"
)

// CORS lets web pages on the configured origins call the router from a browser
// (--cors-allowed-origins): a preflight OPTIONS gets the methods and headers it asks for, and
// every answer to an allowed origin names that origin and exposes the router's headers. Without
// configured origins the router adds no CORS header, and browsers keep pages from reading its
// answers. A worker's own CORS headers are replaced, so the client never sees two answers. The
// admin endpoints and /metrics never get CORS headers: no page is meant to drive or read them.

// corsMaxAge is how long a browser may keep a preflight's answer, in seconds.
const corsMaxAge = "600"

// corsExposed are the answer headers a page may read.
var corsExposed = strings.Join([]string{HeaderRequestID, HeaderWorker, HeaderBaseWorker, HeaderDPRank, HeaderDecision,
	HeaderPrefixMatch, HeaderRetryAfter, "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests",
	"x-ratelimit-reset-requests", "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"}, ", ")

// corsOrigin returns the value of Access-Control-Allow-Origin for the request's Origin, or ""
// when it is not allowed (or the request has none).
func (s *Server) corsOrigin(ctx *fasthttp.RequestCtx) string {
	origin := string(ctx.Request.Header.Peek("Origin"))
	if origin == "" || len(s.opts.CORSOrigins) == 0 {
		return ""
	}
	if slices.Contains(s.opts.CORSOrigins, "*") {
		return "*"
	}
	if slices.Contains(s.opts.CORSOrigins, origin) {
		return origin
	}
	return ""
}

// preflight answers a CORS preflight request, and reports whether it was one.
func (s *Server) preflight(ctx *fasthttp.RequestCtx) bool {
	if !ctx.IsOptions() || len(s.opts.CORSOrigins) == 0 || len(ctx.Request.Header.Peek("Access-Control-Request-Method")) == 0 ||
		s.opts.Own.IsAdmin(string(ctx.Path())) {
		return false
	}
	h := &ctx.Response.Header
	if origin := s.corsOrigin(ctx); origin != "" {
		h.Set("Access-Control-Allow-Origin", origin)
		h.Set("Access-Control-Allow-Methods", "GET, POST, DELETE, OPTIONS")
		if asked := ctx.Request.Header.Peek("Access-Control-Request-Headers"); len(asked) > 0 {
			h.SetBytesV("Access-Control-Allow-Headers", asked)
		}
		h.Set("Access-Control-Max-Age", corsMaxAge)
	}
	h.Set("Vary", "Origin")
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	return true
}

// cors sets the CORS headers of an answer whose headers are otherwise final.
func (s *Server) cors(ctx *fasthttp.RequestCtx) {
	if len(s.opts.CORSOrigins) == 0 || s.opts.Own.IsAdmin(string(ctx.Path())) {
		return
	}
	h := &ctx.Response.Header
	for _, name := range []string{"Access-Control-Allow-Origin", "Access-Control-Allow-Credentials", "Access-Control-Expose-Headers"} {
		h.Del(name)
	}
	h.Add("Vary", "Origin")
	if origin := s.corsOrigin(ctx); origin != "" {
		h.Set("Access-Control-Allow-Origin", origin)
		h.Set("Access-Control-Expose-Headers", corsExposed)
	}
}
