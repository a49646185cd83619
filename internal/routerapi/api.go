// Package routerapi is the router's own HTTP API: the endpoints it answers itself rather than
// forwarding to a worker. Health (/health, /liveness, /readiness), the model list (/v1/models),
// the root index, and, behind the admin guard, /metrics, the worker admin API (/workers,
// /add_worker, /remove_worker, /list_workers), LoRA adapter fan-out and the status page. It is a
// plain net/http handler over the worker pool and the fleet: the proxy serves it on the traffic
// listener for every path its route table does not take, and asks it which paths are its own
// (never passed through to a worker) and which are admin ones (no web page gets CORS headers
// from them).
package routerapi

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/cacheroute/cacheroute/internal/fleet"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Options are the API's knobs, taken from the validated configuration.
type Options struct {
	Pool *workers.Pool
	// Fleet adds and removes workers for the admin API; nil: the admin API cannot change the
	// fleet (tests of other endpoints).
	Fleet Fleet
	// Metrics serves /metrics, whose series name every worker.
	Metrics http.Handler
	// Upstream is the router's way to workers, for the LoRA fan-out: its client and credentials.
	Upstream upstream.Dialer
	// MaxPayloadSize bounds a LoRA request's body (--max-payload-size).
	MaxPayloadSize int64

	AdminAPIKey string // required by admin endpoints when set
	// AdminURLCredentials lets the admin API add worker URLs with user:password@.
	AdminURLCredentials bool
	// AdminOrigins are the web origins (scheme://host[:port]) whose pages may send admin requests
	// that change the router; none by default, so a page in a browser on an admin's machine
	// cannot (--admin-allowed-origins).
	AdminOrigins []string
	// OwnHosts are the names of this host, besides localhost and the loopback addresses, that an
	// admin request's Host may carry when no admin key is set: --host and the machine's name.
	OwnHosts []string
	// ClientKeys, when set, is asked for /v1/models' key: a caller without a valid one gets 401.
	ClientKeys proxy.ClientKeys

	// SessionStore, when set, reports the shared session store's state for /health; with detail
	// false it leaves out what could reveal the store's address (its last error).
	SessionStore func(ctx context.Context, detail bool) any
	// Dashboard, when set, answers GET /dashboard and GET /dashboard/data, under the admin
	// endpoints' guard.
	Dashboard http.Handler
	// KVEvents, when set, reports the workers' KV-cache event streams, for the worker lists; nil
	// when the router subscribes to none (and the admin API then refuses a worker's own endpoint).
	KVEvents func() []kvevents.Status
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

// DashboardPath is the status page's path; its JSON is under DashboardPath+"/data".
const DashboardPath = "/dashboard"

// workerPattern is the path pattern of one worker in the admin API.
const (
	workersPrefix = "/workers/"
	workerPattern = workersPrefix + "{url}"
)

// API is the router's own endpoints.
type API struct {
	opts       Options
	http       *http.Client        // the LoRA fan-out's
	mux        *http.ServeMux      // every endpoint
	allow      map[string][]string // each endpoint's path, with its methods
	adminPaths map[string]bool     // the admin endpoints' paths and patterns
}

// New returns the API.
func New(opts Options) *API {
	a := &API{opts: opts, http: opts.Upstream.Client(), mux: http.NewServeMux(), allow: map[string][]string{}, adminPaths: map[string]bool{}}
	handle := func(method, path string, h http.HandlerFunc) {
		a.mux.HandleFunc(method+" "+path, h)
		a.allow[path] = append(a.allow[path], method)
	}
	// The admin endpoints, and /metrics whose series name every worker, answer only an admin (see
	// admin); web pages get no CORS headers from them, whatever --cors-allowed-origins says.
	handleAdmin := func(method, path string, h http.HandlerFunc) {
		handle(method, path, a.admin(h))
		a.adminPaths[path] = true
	}
	handle("GET", "/v1/models", a.clientAuth(a.models))
	handle("GET", "/health", a.health)
	handle("GET", "/liveness", a.liveness)
	handle("GET", "/readiness", a.readiness)
	handleAdmin("GET", "/metrics", opts.Metrics.ServeHTTP)
	handleAdmin("POST", "/add_worker", a.addWorkerQuery)
	handleAdmin("POST", "/remove_worker", a.removeWorkerQuery)
	handleAdmin("POST", "/v1/load_lora_adapter", a.lora)
	handleAdmin("POST", "/v1/unload_lora_adapter", a.lora)
	handleAdmin("GET", "/list_workers", a.listWorkers)
	handleAdmin("GET", "/workers", a.listWorkers)
	handleAdmin("POST", "/workers", a.addWorkerREST)
	handleAdmin("GET", workerPattern, a.getWorker)
	handleAdmin("DELETE", workerPattern, a.deleteWorker)
	if opts.Dashboard != nil {
		handleAdmin("GET", DashboardPath, opts.Dashboard.ServeHTTP)
		handleAdmin("GET", DashboardPath+"/data", opts.Dashboard.ServeHTTP)
	}
	a.mux.HandleFunc("GET /{$}", a.index) // HEAD too
	a.allow["/"] = []string{"GET", "HEAD"}
	a.mux.HandleFunc("/", a.notFound)
	return a
}

// ServeHTTP answers every request to the router's own endpoints, and 404 or 405 to any other.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

// Owns reports whether path is one of the API's endpoints.
func (a *API) Owns(path string) bool {
	return a.allow[path] != nil || strings.HasPrefix(path, workersPrefix)
}

// IsAdmin reports whether path is an admin endpoint's.
func (a *API) IsAdmin(path string) bool {
	return a.adminPaths[path] || strings.HasPrefix(path, workersPrefix)
}

// index answers GET and HEAD / with 200: what the router serves, for a person or a script that
// asks its root (a browser pointed at the router's address finds the status page from here;
// clients check that a base URL is up with it, as Claude Code sends HEAD / at every start). A
// router's root is its own, never a worker's. It lists every path the router answers itself with
// its methods; the routed paths are forwarded to workers.
func (a *API) index(w http.ResponseWriter, r *http.Request) {
	type rootIndex struct {
		Service     string              `json:"service"`
		StatusPage  string              `json:"status_page,omitempty"`
		RoutedPaths []string            `json:"routed_paths"`
		Endpoints   map[string][]string `json:"endpoints"`
	}
	body := rootIndex{Service: "cacheroute", RoutedPaths: proxy.RoutedPaths(), Endpoints: a.allow}
	if a.opts.Dashboard != nil {
		body.StatusPage = DashboardPath
	}
	writeJSON(w, http.StatusOK, body)
}

// notFound answers every request no endpoint took: a known path asked with the wrong method gets
// 405 with an Allow header, anything else 404, both as OpenAI error bodies.
func (a *API) notFound(w http.ResponseWriter, r *http.Request) {
	path := r.URL.Path
	if strings.HasPrefix(path, workersPrefix) {
		path = workerPattern
	}
	if methods := a.allow[path]; len(methods) > 0 {
		w.Header().Set("Allow", strings.Join(methods, ", "))
		proxy.WriteError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "method "+r.Method+" is not allowed on "+r.URL.Path)
		return
	}
	proxy.WriteError(w, http.StatusNotFound, "invalid_request_error", "not_found",
		"no route for "+r.Method+" "+r.URL.Path+"; routed paths: "+strings.Join(proxy.RoutedPaths(), ", "))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}
