// Package proxy is the router's HTTP face. The routed endpoints run on fasthttp: each request is
// read once (bounded in size and time), parsed once, placed by the policy (choose → accept →
// commit), forwarded as the original bytes, and its answer streamed back unbuffered, with retries
// only for what provably never started on a worker. Health, model list, metrics and admin
// endpoints are plain net/http handlers served on the same listener.
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
	"github.com/cacheroute/cacheroute/internal/fleet"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/responsesearch"
	"github.com/cacheroute/cacheroute/internal/telemetry"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/tokenize"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Options are the proxy's knobs, taken from the validated configuration.
type Options struct {
	MaxPayloadSize int64
	MaxRetries     int
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	AdminAPIKey    string // required by admin endpoints when set
	// AdminURLCredentials lets the admin API add worker URLs with user:password@.
	AdminURLCredentials bool
	// AdminOrigins are the web origins (scheme://host[:port]) whose pages may send admin requests
	// that change the router; none by default, so a page in a browser on an admin's machine
	// cannot (--admin-allowed-origins).
	AdminOrigins []string
	// OwnHosts are the names of this host, besides localhost and the loopback addresses, that an
	// admin request's Host may carry when no admin key is set: --host and the machine's name.
	OwnHosts []string
	// ClientKeys, when set, is asked for every routed request's and /v1/models' key: a caller
	// without a valid one gets 401. Unless ForwardClientAuth, the client's key is then not sent
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

	// SessionStore, when set, reports the shared session store's state for /health; with detail
	// false it leaves out what could reveal the store's address (its last error).
	SessionStore func(ctx context.Context, detail bool) any
	// Dashboard, when set, answers GET /dashboard and GET /dashboard/data, under the admin
	// endpoints' guard.
	Dashboard http.Handler
	// KVEvents, when set, reports the workers' KV-cache event streams, for the worker lists; nil
	// when the router subscribes to none (and the admin API then refuses a worker's own endpoint).
	KVEvents func() []kvevents.Status
	// Tokenize, when set, asks an engine for the prompt tokens of the requests the policy may
	// match against the engines' KV-cache events (tokens.go).
	Tokenize *tokenize.Client
	// PD, when set, prefills and decodes the requests of the routes that allow it on two workers
	// (pd.go).
	PD *PDOptions
}

// ClientKeys tells a client by the API key it presents.
type ClientKeys interface {
	Lookup(presentedKey string) (clientkeys.Client, bool)
}

// Fleet changes the set of workers; the router implements it with its fleet.Fleet, so that a
// worker the admin API adds joins as every other does (allow-checked, probed, told to the policy)
// and one it removes is forgotten by every piece of state that names it.
type Fleet interface {
	Join(ctx context.Context, src fleet.Source, u tenant.URL, role workers.Role, ev kvevents.WorkerEndpoints) (fleet.Joined, error)
	Remove(u tenant.URL) error
	// CheckWorker probes a registered worker URL now: its health and its model list.
	CheckWorker(ctx context.Context, url string)
}

// Server routes requests over a pool of workers.
type Server struct {
	opts         Options
	pool         *workers.Pool
	fleet        Fleet
	policy       policy.Policy
	labeled      bool                 // the policy's labels are counted per label
	responses    policy.ResponseStore // the policy's map of stored responses; nil when it keeps none
	metrics      *metrics.Metrics
	log          *slog.Logger
	upstreams    *upstream.Pools
	routes       map[string]*route
	mux          *http.ServeMux // every endpoint that is not routed
	workerClient *http.Client
	search       *responsesearch.Searcher
	bodies       *bodies.Budget
	plain        fasthttp.RequestHandler
	adminPaths   map[string]bool     // the admin endpoints' paths and patterns
	ownPaths     map[string][]string // the router's own endpoints' paths, with their methods

	// queueClosed ends when the shutdown grace does: requests still waiting for admission are
	// then answered 503 (EndQueue).
	queueClosed context.Context
	closeQueue  context.CancelFunc
}

// workerPattern is the path pattern of one worker in the admin API.
const (
	workersPrefix = "/workers/"
	workerPattern = workersPrefix + "{url}"
)

// isAdminPath reports whether path is an admin endpoint's.
func (s *Server) isAdminPath(path string) bool {
	return s.adminPaths[path] || strings.HasPrefix(path, workersPrefix)
}

// New returns a server.
func New(opts Options, pool *workers.Pool, fleet Fleet, p policy.Policy, m *metrics.Metrics, log *slog.Logger) *Server {
	s := &Server{opts: opts, pool: pool, fleet: fleet, policy: p, metrics: m, log: log,
		routes: newRoutes(m), mux: http.NewServeMux(),
		workerClient: opts.Upstream.Client(),
		bodies:       bodies.NewBudget(opts.MaxBodyBytesTotal, opts.MaxBodyBytesPerClient)}
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
	allow := map[string][]string{} // path → methods, for 405 answers
	s.ownPaths = allow
	handle := func(method, path string, h http.HandlerFunc) {
		s.mux.HandleFunc(method+" "+path, h)
		allow[path] = append(allow[path], method)
	}
	// The admin endpoints, and /metrics whose series name every worker, answer only an admin (see
	// admin); web pages get no CORS headers from them, whatever --cors-allowed-origins says.
	s.adminPaths = map[string]bool{}
	handleAdmin := func(method, path string, h http.HandlerFunc) {
		handle(method, path, s.admin(h))
		s.adminPaths[path] = true
	}
	handle("GET", "/v1/models", s.clientAuth(s.models))
	handle("GET", "/health", s.health)
	handle("GET", "/liveness", s.liveness)
	handle("GET", "/readiness", s.readiness)
	handleAdmin("GET", "/metrics", m.Handler().ServeHTTP)
	handleAdmin("POST", "/add_worker", s.addWorkerQuery)
	handleAdmin("POST", "/remove_worker", s.removeWorkerQuery)
	handleAdmin("POST", "/v1/load_lora_adapter", s.lora)
	handleAdmin("POST", "/v1/unload_lora_adapter", s.lora)
	handleAdmin("GET", "/list_workers", s.listWorkers)
	handleAdmin("GET", "/workers", s.listWorkers)
	handleAdmin("POST", "/workers", s.addWorkerREST)
	handleAdmin("GET", workerPattern, s.getWorker)
	handleAdmin("DELETE", workerPattern, s.deleteWorker)
	if opts.Dashboard != nil {
		handleAdmin("GET", DashboardPath, opts.Dashboard.ServeHTTP)
		handleAdmin("GET", DashboardPath+"/data", opts.Dashboard.ServeHTTP)
	}
	s.mux.HandleFunc("GET /{$}", s.index(allow)) // HEAD too
	allow["/"] = []string{"GET", "HEAD"}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { notFound(w, r, allow) })
	s.plain = servePlain(s.mux)
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

// notFound answers every request no route took: a known path asked with the wrong method gets
// 405 with an Allow header, anything else 404, both as OpenAI error bodies.
func notFound(w http.ResponseWriter, r *http.Request, allow map[string][]string) {
	path := r.URL.Path
	if strings.HasPrefix(path, workersPrefix) {
		path = workerPattern
	}
	if methods := allow[path]; len(methods) > 0 {
		w.Header().Set("Allow", strings.Join(methods, ", "))
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "method "+r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	writeError(w, http.StatusNotFound, "invalid_request_error", "not_found",
		"no route for "+r.Method+" "+r.URL.Path+"; routed paths: "+strings.Join(RoutedPaths(), ", "))
}

type discardLogger struct{}

func (discardLogger) Printf(string, ...any) {}
