// Package proxy is the router's HTTP face: HTTP in, HTTP out. The routed endpoints run on
// fasthttp: each request is read once (bounded in size and time), parsed once by its route
// (routes.go), admitted, and sent through the one attempt loop (forward.go), which places it by
// the policy (choose → accept → commit), forwards the original bytes, and tries another worker
// only for what provably never started on one; the answer is relayed unbuffered (relay.go), and
// every answer the router makes itself has its route's error shape (errors.go).
//
// The proxy decides none of the rest, and holds no state of its own beyond a request's: the
// connections to workers and what a failed call did on the wire are package upstream's; the
// body budget is package bodies'; the search for a stored response package responsesearch's;
// the prompt tokens package tokenize's; what an answer reports of itself package sniff's; P/D's
// JSON package kvtransfer's; and the router's own endpoints (health, model list, metrics, admin
// API) are package routerapi's, plain net/http handlers served on the same listener (plain.go).
//
// fasthttp reuses every buffer of a request, and of a worker's answer, once the request is over:
// a string or slice that shares their memory is rewritten by the next request on the listener, so
// nothing that outlives the request or goes to another goroutine may alias them. The rule is
// "copy at the boundary": a value read from a request or an answer becomes its own string
// (string(b), never an unsafe conversion) or its own slice (bytes.Clone) before it is kept in a
// map, a store, a queue or a log entry, and the net/http handlers get a request built from copies
// only (plain.go). The poison test build (go test -tags cacheroute_poison, poison.go) overwrites a
// request's buffers as soon as its handler returns, so a value kept without a copy shows at once.
package proxy

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/bodies"
	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/responsesearch"
	"github.com/cacheroute/cacheroute/internal/telemetry"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Options are the proxy's knobs, taken from the validated configuration.
type Options struct {
	MaxPayloadSize int64
	MaxRetries     int
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// Own answers every request the route table does not take: the router's own endpoints
	// (package routerapi). Required.
	Own OwnEndpoints
	// ClientKeys, when set, is asked for every routed request's key: a caller without a valid
	// one gets 401. Unless ForwardClientAuth, the client's key is then not sent
	// to workers (they get the worker's credential, Upstream.Authorization).
	ClientKeys        ClientKeys
	ForwardClientAuth bool
	// Admission, when set, applies rate limits and admission control to routed requests.
	Admission *Admission
	// AccessLog, when set, receives one entry per routed request.
	AccessLog *telemetry.AccessLog
	// Tracer, when set, records a trace of each routed request; nil: tracing is off.
	Tracer *telemetry.Tracer
	// CORSOrigins are the web origins whose pages may call the router ("*": any); none: no CORS.
	CORSOrigins []string
	// StrictModels refuses a request naming a model no healthy worker lists (404) rather than
	// forwarding it (models.go).
	StrictModels bool
	// RefuseUnknownPaths answers 404 on a path the router neither routes nor serves itself,
	// rather than forwarding it to a worker (routes.go).
	RefuseUnknownPaths bool

	ClientHeaderTimeout time.Duration // a new connection's first request line and any request's headers
	ClientBodyTimeout   time.Duration // a request's whole body, once its headers arrived
	KeepaliveTimeout    time.Duration // an idle keep-alive client connection
	ClientWriteTimeout  time.Duration // a client's acceptance of each piece of its answer; 0: only RequestTimeout
	MaxClientConns      int           // open client connections; more get 503
	MaxBodyBytesTotal   int64         // request-body bytes held at once, all requests together; over it 503 (package bodies); 0: none
	Upstream            upstream.PoolOptions
	// ResponseSearch bounds the searches for stored responses the router does not know (search.go).
	ResponseSearch responsesearch.Options
	// MaxBodyBytesPerClient bounds the request-body bytes one client's requests hold at once
	// (a client: its key's tenant, else its address); over it 429 (package bodies); 0: none.
	MaxBodyBytesPerClient int64

	// PD, when set, prefills and decodes the requests of the routes that allow it on two workers
	// (pd.go).
	PD *PDOptions
}

// ClientKeys tells a client by the API key it presents.
type ClientKeys interface {
	Lookup(presentedKey string) (clientkeys.Client, bool)
}

// OwnEndpoints are the endpoints the router answers itself, served as net/http handlers on the
// traffic listener (plain.go).
type OwnEndpoints interface {
	http.Handler
	// Owns reports whether path is one of them: never passed through to a worker.
	Owns(path string) bool
	// IsAdmin reports whether path is an admin endpoint: no web page gets CORS headers from it.
	IsAdmin(path string) bool
}

// Server routes requests over a pool of workers.
type Server struct {
	opts      Options
	pool      *workers.Pool
	policy    policy.Policy
	labeled   bool                 // the policy's labels are counted per label
	responses policy.ResponseStore // the policy's map of stored responses; nil when it keeps none
	metrics   *metrics.Metrics
	log       *slog.Logger
	upstreams *upstream.Pools
	routes    map[string]*route
	search    *responsesearch.Searcher
	bodies    *bodies.Budget
	plain     fasthttp.RequestHandler // Options.Own on the traffic listener

	// queueClosed ends when the shutdown grace does: requests still waiting for admission are
	// then answered 503 (EndQueue).
	queueClosed context.Context
	closeQueue  context.CancelFunc
}

// New returns a server.
func New(opts Options, pool *workers.Pool, p policy.Policy, m *metrics.Metrics, log *slog.Logger) *Server {
	s := &Server{opts: opts, pool: pool, policy: p, metrics: m, log: log, routes: newRoutes(m),
		bodies: bodies.NewBudget(opts.MaxBodyBytesTotal, opts.MaxBodyBytesPerClient), plain: servePlain(opts.Own)}
	up := opts.Upstream
	up.Resent = func(f upstream.Failure) { m.UpstreamErrors.WithLabelValues(f.Kind).Inc() } // then sent again on a new connection
	s.upstreams = upstream.NewPools(up)
	s.search = responsesearch.New(opts.ResponseSearch, s.upstreams, m)
	s.queueClosed, s.closeQueue = context.WithCancel(context.Background())
	s.responses = p.Responses()
	if opts.PD != nil {
		for _, path := range PDPaths {
			m.PDRequests.WithLabelValues(path)
		}
	}
	if labels := p.Labels(); len(labels) > 0 {
		s.labeled = true
		for _, label := range labels {
			m.CacheAwareDecisions.WithLabelValues(label)
		}
		if s.responses != nil { // the labels of continuations the proxy searches for
			m.CacheAwareDecisions.WithLabelValues(labelResponseSearch)
			m.CacheAwareDecisions.WithLabelValues(labelResponseMiss)
		}
	}
	for _, reason := range []string{rejectedBySearchBudget, rejectedByTotalSearchBudget, rejectedByShutdown} {
		m.AdmissionRejections.WithLabelValues(reason) // at 0 from the start, for rate() and alerts
	}
	return s
}

// serve is the fasthttp handler of every endpoint. It reads the request's body first (body.go),
// and lets go of it last: after afterRequest, and after taking the body off the request, since
// the memory may go back to the system as soon as the exchange is done with it too.
func (s *Server) serve(ctx *fasthttp.RequestCtx) {
	body, err := s.receive(ctx, s.bodyClient(ctx))
	if err != nil {
		rt, _ := lookup(s.routes, string(ctx.Path()))
		s.answerBodyError(ctx, rt, err)
		ctx.Request.ResetBody() // the rest of the body stays unread: nothing may read it now
	} else {
		ctx.Request.SetBodyRaw(body.Bytes())
		if !s.preflight(ctx) {
			s.answer(ctx, body)
			s.cors(ctx)
		}
	}
	if afterRequest != nil {
		afterRequest(ctx)
	}
	if body != nil {
		ctx.Request.SetBodyRaw(nil)
		body.Release()
	}
}

// afterRequest, when set, runs once each request's handler has returned; only the poison test
// build sets it (poison.go).
var afterRequest func(*fasthttp.RequestCtx)

// answer answers one request: forwarded when its path is routed, else by the net/http handlers.
// An exchange holds the body until its end, which for a streamed answer comes after serve
// returns.
func (s *Server) answer(ctx *fasthttp.RequestCtx, body *bodies.Body) {
	if rt, id := s.routeOf(string(ctx.Path())); rt != nil {
		if method := string(ctx.Method()); !rt.allows(method) {
			allow := strings.Join(rt.methods, ", ")
			ctx.Response.Header.Set("Allow", allow)
			status := writeFastError(ctx, rt.errors, fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed",
				"method "+method+" is not allowed on "+rt.path+"; use "+allow)
			rt.count(ctx.Time(), metrics.StatusClass(status), time.Now())
			return
		}
		s.forward(ctx, rt, id, body)
		return
	}
	s.plain(ctx)
}

// HTTPServer returns the fasthttp server of the traffic listener, with the client-side limits:
// header, body and idle timeouts, the body size limit and the connection cap. Bodies are
// streamed to the handler, which reads them itself (body.go), multipart ones as they came.
func (s *Server) HTTPServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                      s.serve,
		Name:                         "cacheroute",
		ReadTimeout:                  s.opts.ClientHeaderTimeout,
		IdleTimeout:                  s.opts.KeepaliveTimeout,
		WriteTimeout:                 time.Minute, // non-routed answers; routed ones set the request's own deadline
		Concurrency:                  s.opts.MaxClientConns,
		MaxRequestBodySize:           int(s.opts.MaxPayloadSize),
		ReadBufferSize:               16 << 10,
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		SecureErrorLogMessage:        true,
		Logger:                       discardLogger{},
		StreamRequestBody:            true,
		DisablePreParseMultipartForm: true,
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: s.opts.ClientBodyTimeout}
		},
		ErrorHandler: s.clientError,
	}
}

// clientError answers a request fasthttp could not read: too large, too slow, malformed.
func (s *Server) clientError(ctx *fasthttp.RequestCtx, err error) {
	rt, _ := lookup(s.routes, string(ctx.Path()))
	var small *fasthttp.ErrSmallBuffer
	if rt == nil && errors.As(err, &small) { // the headers were not parsed: read the request line
		rt, _ = lookup(s.routes, requestPathOf(ctx.Conn()))
	}
	shape := openAIErrors
	if rt != nil {
		shape = rt.errors
	}
	var status int
	switch {
	case errors.As(err, &small):
		status = writeFastError(ctx, shape, fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "headers_too_large", "request headers are too large")
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		status = writeFastError(ctx, shape, fasthttp.StatusRequestEntityTooLarge, "invalid_request_error", "payload_too_large",
			"request body exceeds the limit of "+itoa(s.opts.MaxPayloadSize)+" bytes (--max-payload-size)")
	case upstream.IsTimeout(err):
		status = writeFastError(ctx, shape, fasthttp.StatusRequestTimeout, "invalid_request_error", "request_timeout", "the request was not received in time")
	default:
		status = writeFastError(ctx, shape, fasthttp.StatusBadRequest, "invalid_request_error", "bad_request", "malformed HTTP request")
	}
	ctx.SetConnectionClose()
	// A request whose headers named a routed path is counted under it, like any other answer.
	if rt != nil {
		rt.count(ctx.Time(), metrics.StatusClass(status), time.Now())
	}
}

// WorkerRemoved drops the connection pool of a removed worker URL.
func (s *Server) WorkerRemoved(url string) { s.upstreams.Forget(url) }

// CloseIdleConnections closes idle worker connections (shutdown).
func (s *Server) CloseIdleConnections() { s.upstreams.CloseIdle() }

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}
