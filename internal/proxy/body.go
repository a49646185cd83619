package proxy

import (
	"errors"
	"net"
	"net/netip"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/bodies"
	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/upstream"
)

// body.go reads each request's body, once, before anything else (package bodies counts it in
// the body budget as it arrives), and answers a body that could not be read.

// bodyError is why a body could not be read, with the answer it gets.
type bodyError struct {
	status int
	code   string
	msg    string
	over   bodies.Over
}

// receive reads the request's body into memory of its own, counted in the budget as it arrives.
// client is who sends it (clientName). On failure it returns the error to answer, having given
// back whatever the body counted.
func (s *Server) receive(ctx *fasthttp.RequestCtx, client string) (*bodies.Body, *bodyError) {
	length := ctx.Request.Header.ContentLength() // -1: chunked; -2 (or 0): no body
	if length == 0 || length < -1 {
		return s.bodies.Empty(), nil
	}
	if int64(length) > s.opts.MaxPayloadSize {
		return nil, tooLarge(s.opts.MaxPayloadSize)
	}
	limit := length
	if length < 0 {
		limit = int(s.opts.MaxPayloadSize)
	}
	if length > 0 {
		if over := s.bodies.Fits(client, 2*int64(length)); over != bodies.Within {
			return nil, &bodyError{over: over}
		}
	}
	h, err := s.bodies.Read(ctx.RequestBodyStream(), client, length, limit, func() { _ = ctx.Conn().SetReadDeadline(time.Now()) })
	var over *bodies.OverError
	switch {
	case err == nil:
		return h, nil
	case errors.As(err, &over):
		return nil, &bodyError{over: over.Over}
	case errors.Is(err, bodies.ErrTooLarge):
		return nil, tooLarge(s.opts.MaxPayloadSize)
	case upstream.IsTimeout(err):
		return nil, &bodyError{status: fasthttp.StatusRequestTimeout, code: "request_timeout", msg: "the request was not received in time"}
	case errors.Is(err, bodies.ErrCut):
		return nil, &bodyError{status: fasthttp.StatusBadRequest, code: "bad_request", msg: bodies.ErrCut.Error()}
	}
	return nil, &bodyError{status: fasthttp.StatusBadRequest, code: "bad_request", msg: "malformed HTTP request"}
}

func tooLarge(limit int64) *bodyError {
	return &bodyError{status: fasthttp.StatusRequestEntityTooLarge, code: "payload_too_large",
		msg: "request body exceeds the limit of " + itoa(limit) + " bytes (--max-payload-size)"}
}

// answerBodyError answers a request whose body could not be read, in its route's shape, and
// closes the connection: what is left of the body is not read.
func (s *Server) answerBodyError(ctx *fasthttp.RequestCtx, rt *route, e *bodyError) {
	shape := openAIErrors
	if rt != nil {
		shape = rt.errors
	}
	var status int
	switch e.over {
	case bodies.OverTotal:
		ctx.Response.Header.Set(HeaderRetryAfter, "1")
		status = writeFastError(ctx, shape, fasthttp.StatusServiceUnavailable, "server_error", "request_bodies_over_budget",
			"the router holds as many request bodies as it may at once (--max-request-body-bytes-total); try again shortly")
	case bodies.OverClientShare:
		ctx.Response.Header.Set(HeaderRetryAfter, "1")
		status = writeFastError(ctx, shape, fasthttp.StatusTooManyRequests, "rate_limit_error", "request_bodies_over_client_budget",
			"this client's requests hold as many body bytes as one client may at once (--max-request-body-bytes-per-client); try again shortly")
	default:
		status = writeFastError(ctx, shape, e.status, "invalid_request_error", e.code, e.msg)
	}
	ctx.SetConnectionClose()
	if rt != nil {
		rt.count(ctx.Time(), metrics.StatusClass(status), time.Now())
	}
}

// clientName is who a request comes from, for the bounds each client has (its share of the body
// budget, its searches): its key's tenant when client keys are checked and it presented a valid
// one, else its address (an IPv4 address, or the IPv6 /64 a host is usually given, as
// --max-connections-per-client counts them).
func clientName(tenant string, addr net.IP) string {
	if tenant != "" {
		return "tenant:" + tenant
	}
	ip, ok := netip.AddrFromSlice(addr)
	if !ok {
		return "addr:"
	}
	ip = ip.Unmap()
	if ip.Is6() {
		p, _ := ip.Prefix(64)
		return "addr:" + p.String()
	}
	return "addr:" + ip.String()
}

// bodyClient names the client of a request whose body is about to be read: by its client key's
// tenant when keys are checked and the key is valid, else by its address.
func (s *Server) bodyClient(ctx *fasthttp.RequestCtx) string {
	var tenant string
	if s.opts.ClientKeys != nil {
		key := clientkeys.FromHeaders(func(name string) string { return string(ctx.Request.Header.Peek(name)) })
		if c, ok := s.opts.ClientKeys.Lookup(key); ok {
			tenant = c.Tenant
		}
	}
	return clientName(tenant, ctx.RemoteIP())
}
