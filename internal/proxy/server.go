// Package proxy is the router's HTTP face: it reads and checks each request once, asks the policy
// for a worker, forwards the original bytes, streams the answer back unbuffered, retries elsewhere
// while nothing has reached the client, and serves the health, model list, metrics and admin
// endpoints.
package proxy

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Options are the proxy's knobs, taken from the validated configuration.
type Options struct {
	MaxPayloadSize int64
	RequestTimeout time.Duration
	MaxRetries     int
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	APIKey         string // sent upstream when the client sent no Authorization
	AdminAPIKey    string // required by admin endpoints when set
	// SessionStore, when set, reports the shared session store's state for /health.
	SessionStore func(ctx context.Context) any
}

// Fleet changes the set of workers; the router implements it so that adding a worker also probes
// it and removing one also clears every piece of state that names it.
type Fleet interface {
	AddWorker(ctx context.Context, url string) error
	RemoveWorker(url string) error
}

// Server routes requests over a pool of workers.
type Server struct {
	opts      Options
	pool      *workers.Pool
	fleet     Fleet
	policy    policy.Policy
	metrics   *metrics.Metrics
	transport http.RoundTripper
	log       *slog.Logger
	mux       *http.ServeMux
	paths     map[string]bool // every routed path, to tell 405 from 404
}

// RoutedPaths are the POST endpoints forwarded to a worker chosen by the policy.
var RoutedPaths = []string{
	"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/generate",
	"/v1/rerank", "/rerank", "/tokenize", "/detokenize",
}

// New returns a server; transport carries the upstream requests.
func New(opts Options, pool *workers.Pool, fleet Fleet, p policy.Policy, m *metrics.Metrics, transport http.RoundTripper, log *slog.Logger) *Server {
	s := &Server{opts: opts, pool: pool, fleet: fleet, policy: p, metrics: m, transport: transport, log: log,
		mux: http.NewServeMux(), paths: map[string]bool{}}
	for _, path := range RoutedPaths {
		s.handle("POST", path, s.routed(path))
	}
	s.handle("GET", "/v1/models", s.models)
	s.handle("GET", "/health", s.health)
	s.handle("GET", "/liveness", s.liveness)
	s.handle("GET", "/readiness", s.readiness)
	s.handle("GET", "/metrics", m.Handler().ServeHTTP)

	s.handle("POST", "/add_worker", s.admin(s.addWorkerQuery))
	s.handle("POST", "/remove_worker", s.admin(s.removeWorkerQuery))
	s.handle("GET", "/list_workers", s.admin(s.listWorkers))
	s.handle("GET", "/workers", s.admin(s.listWorkers))
	s.handle("POST", "/workers", s.admin(s.addWorkerREST))
	s.handle("GET", "/workers/{url}", s.admin(s.getWorker))
	s.handle("DELETE", "/workers/{url}", s.admin(s.deleteWorker))
	s.mux.HandleFunc("/", s.notFound)
	return s
}

func (s *Server) handle(method, path string, h http.HandlerFunc) {
	s.mux.HandleFunc(method+" "+path, h)
	s.paths[path] = true
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// notFound answers every request no route took: a known path asked with the wrong method gets 405,
// anything else 404, both as OpenAI error bodies.
func (s *Server) notFound(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if strings.HasPrefix(path, "/workers/") {
		path = "/workers/{url}"
	}
	if s.paths[path] {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "method "+r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	writeError(w, http.StatusNotFound, "invalid_request_error", "not_found", "no route for "+r.Method+" "+r.URL.Path)
}
