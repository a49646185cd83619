package proxy

import (
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
)

// routes.go is the route table: every path the router forwards to one worker, how its body is
// read, what the router's own errors on it look like, and how its worker is found; and the
// pass-through route that takes every other path the router does not serve itself.

// placement says how a routed request's worker is found.
type placement uint8

const (
	// byPolicy: the policy's decision chain over the workers serving the body's model. What the
	// route's reader derives (session, history, response id) is what the policy may learn; the
	// load-only readers derive nothing, so those routes are placed by load and teach nothing.
	byPolicy placement = iota
	// byResponseID: the worker that stored the response named in the path, or, when the router
	// does not know the id, every healthy worker in turn until one has it.
	byResponseID
)

// bodyReader derives what routing needs from a request's headers and body, in one parse: the
// route's protocol. The Request it returns also renders the body's /tokenize query when a
// policy asks for the request's prompt tokens (policy.Input.PromptTokens).
type bodyReader func(h reqkey.Header, body []byte) (*protocol.Request, error)

// route is one routed endpoint, with its metric series resolved once rather than looked up by
// label on every request.
type route struct {
	path    string   // the path, or its pattern ({id}); also its metrics label
	methods []string // the methods it takes
	read    bodyReader
	errors  errorShape
	place   placement
	// anyMethod: the route takes every method (the pass-through route).
	anyMethod bool
	// storesResponses says that a 2xx answer carries the id of a response stored on its worker
	// (POST /v1/responses): the policy is told where it lives.
	storesResponses bool
	// pd says that vLLM takes kv_transfer_params on the route, so that it can be prefilled and
	// decoded on two workers (pd.go).
	pd       bool
	requests map[string]prometheus.Counter // by status class
	duration prometheus.Observer
	ttfb     prometheus.Observer
}

var post = []string{"POST"}

// routeTable lists every routed endpoint.
var routeTable = []route{
	{path: protocol.ChatPath, read: protocol.ParseChat, pd: true},
	{path: protocol.CompletionsPath, read: protocol.ParseCompletions, pd: true},
	{path: protocol.GeneratePath, read: protocol.ParseGenerate},
	{path: protocol.ResponsesPath, read: protocol.ParseResponses, storesResponses: true},
	{path: protocol.MessagesPath, read: protocol.ParseMessages, errors: anthropicErrors},
	{path: protocol.CountTokensPath, read: protocol.ParseModel, errors: anthropicErrors},
	{path: "/tokenize", read: protocol.ParseModel},
	{path: "/detokenize", read: protocol.ParseModel},
	{path: "/v1/embeddings", read: protocol.ParseModel},
	{path: "/v1/score", read: protocol.ParseModel},
	{path: "/score", read: protocol.ParseModel},
	{path: "/v1/rerank", read: protocol.ParseModel},
	{path: "/rerank", read: protocol.ParseModel},
	{path: "/pooling", read: protocol.ParseModel},
	{path: "/classify", read: protocol.ParseModel},
	{path: "/v1/audio/transcriptions", read: readMultipart},
	{path: "/v1/audio/translations", read: readMultipart},
	{path: responsePattern, methods: []string{"GET", "DELETE"}, place: byResponseID},
	{path: responsePattern + "/cancel", place: byResponseID},
	{path: responsePattern + "/input_items", methods: []string{"GET"}, place: byResponseID},
}

// passThrough is the route of every path that is neither in the table nor one of the router's
// own endpoints: vLLM's /version, /ping, /invocations, /v2/rerank and whatever vLLM serves next.
// Such a request is forwarded as it came, whatever its method, to the worker the policy's load
// step chooses among the workers of the model its JSON body names (any available worker when it
// names none); nothing is learned from it. All such paths share one metrics label, never the path
// itself, so that clients cannot make series.
var passThrough = route{path: passThroughPattern, read: readPassThrough, anyMethod: true}

// passThroughPattern is the pass-through route's label in metrics, the access log and traces.
const passThroughPattern = "/{path}"

const (
	responsesPrefix = protocol.ResponsesPath + "/"
	responsePattern = responsesPrefix + "{id}"
)

// statusClasses are every status_class a routed request can end with.
var statusClasses = []string{"1xx", "2xx", "3xx", "4xx", "5xx", metrics.StatusCut}

// count records one finished request: its status class, its duration, and its time to the first
// byte of the answer (zero firstByte: the request got none, its client having left).
func (rt *route) count(start time.Time, class string, firstByte time.Time) {
	rt.requests[class].Inc()
	rt.duration.Observe(time.Since(start).Seconds())
	if !firstByte.IsZero() {
		rt.ttfb.Observe(firstByte.Sub(start).Seconds())
	}
}

// RoutedPaths lists the routed endpoints' paths and patterns, in table order.
func RoutedPaths() []string {
	out := make([]string, len(routeTable))
	for i := range routeTable {
		out[i] = routeTable[i].path
	}
	return out
}

// newRoutes returns the route table with each route's metric series, by path or pattern.
func newRoutes(m *metrics.Metrics) map[string]*route {
	routes := make(map[string]*route, len(routeTable)+1)
	for _, spec := range append(slices.Clip(routeTable), passThrough) {
		rt := spec
		if rt.methods == nil {
			rt.methods = post
		}
		rt.requests = map[string]prometheus.Counter{}
		rt.duration, rt.ttfb = m.RequestDuration.WithLabelValues(rt.path), m.TimeToFirstByte.WithLabelValues(rt.path)
		for _, class := range statusClasses {
			rt.requests[class] = m.Requests.WithLabelValues(rt.path, class)
		}
		routes[rt.path] = &rt
	}
	return routes
}

// lookup finds the route of path, and the response id a byResponseID path names.
func lookup(routes map[string]*route, path string) (rt *route, id string) {
	if rt := routes[path]; rt != nil && rt.place == byPolicy {
		return rt, ""
	}
	rest, ok := strings.CutPrefix(path, responsesPrefix)
	if !ok {
		return nil, ""
	}
	id, suffix, _ := strings.Cut(rest, "/")
	if id == "" || (suffix != "" && suffix != "cancel" && suffix != "input_items") {
		return nil, ""
	}
	pattern := responsePattern
	if suffix != "" {
		pattern += "/" + suffix
	}
	return routes[pattern], id
}

// routeOf finds the route of path, and the response id a byResponseID path names: a routed
// endpoint's, else the pass-through route for a path that is not one of the router's own
// endpoints (the admin API, health, models, metrics, the status page), unless
// RefuseUnknownPaths. nil: the net/http handlers answer (404 for an unknown path).
func (s *Server) routeOf(path string) (*route, string) {
	if rt, id := lookup(s.routes, path); rt != nil {
		return rt, id
	}
	if s.opts.RefuseUnknownPaths || s.opts.Own.Owns(path) {
		return nil, ""
	}
	return s.routes[passThroughPattern], ""
}

// readPassThrough reads what it can of a pass-through request: a JSON object's model and stream,
// as the load-only routes do. Any other body (none, not JSON) is forwarded as it came, for the
// worker to answer; it is not refused here.
func readPassThrough(h reqkey.Header, body []byte) (*protocol.Request, error) {
	if r, err := protocol.ParseModel(h, body); err == nil {
		return r, nil
	}
	return &protocol.Request{}, nil
}

// allows reports whether the route takes method.
func (rt *route) allows(method string) bool {
	return rt.anyMethod || slices.Contains(rt.methods, method)
}
