package routerapi

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/fleet"
	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// admin guards an admin endpoint. When an admin key is configured, the request must carry it as
// a bearer token (compared in constant time). Without one, the admin plane is closed to every
// caller but a local one (see localCaller): an open port must never let a client add a worker that
// would then receive other clients' prompts and the router's worker key. Either way, a request
// that changes the fleet must not come from a web page (see fromBrowserPage) and must carry its
// body, if any, as JSON: a browser can send a cross-site form or a text/plain POST without the
// page's consent, but never a cross-site JSON one.
func (a *API) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case a.opts.AdminAPIKey != "" && !a.isAdmin(r):
			proxy.WriteError(w, http.StatusUnauthorized, "authentication_error", "invalid_admin_api_key", "admin endpoints require a valid admin API key")
			return
		case a.opts.AdminAPIKey == "" && !isLocal(r):
			proxy.WriteError(w, http.StatusForbidden, "permission_error", "admin_loopback_only",
				"without --admin-api-key the admin endpoints answer only callers on this host's loopback")
			return
		case a.opts.AdminAPIKey == "" && !a.ownHost(r.Host):
			proxy.WriteError(w, http.StatusForbidden, "permission_error", "admin_host_not_allowed",
				"without --admin-api-key the admin endpoints answer only requests whose Host is localhost, a loopback address, --host or this machine's name")
			return
		}
		if changesState(r) {
			if origin, ok := a.fromBrowserPage(r); ok {
				proxy.WriteError(w, http.StatusForbidden, "permission_error", "admin_origin_not_allowed",
					"admin requests from the web origin "+truncate(origin, 200)+" are refused (see --admin-allowed-origins)")
				return
			}
			if !jsonOrNoBodyType(r) {
				proxy.WriteError(w, http.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_media_type",
					"an admin request's body must be sent as Content-Type: application/json")
				return
			}
		}
		h(w, r)
	}
}

// changesState reports whether an admin request may change the router (every method but GET and
// HEAD).
func changesState(r *http.Request) bool {
	return r.Method != http.MethodGet && r.Method != http.MethodHead
}

// fromBrowserPage returns the web origin of a page that sent r, from its Origin header or, without
// one, its Referer, and reports true when that origin is not in --admin-allowed-origins. A request
// with neither header (curl, a script, kubectl) is not from a page. Browsers send Origin with every
// cross-origin POST and DELETE, "null" included, which is never allowed.
func (a *API) fromBrowserPage(r *http.Request) (string, bool) {
	origin := r.Header.Get("Origin")
	if origin == "" {
		ref := r.Header.Get("Referer")
		if ref == "" {
			return "", false
		}
		u, err := url.Parse(ref)
		if err != nil || u.Host == "" {
			return ref, true
		}
		origin = u.Scheme + "://" + u.Host
	}
	for _, allowed := range a.opts.AdminOrigins {
		if strings.EqualFold(allowed, origin) {
			return origin, false
		}
	}
	return origin, true
}

// jsonOrNoBodyType reports whether r's Content-Type is application/json (with any parameters) or
// absent, as in `curl -X POST '.../add_worker?url=...'`.
func jsonOrNoBodyType(r *http.Request) bool {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return true
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "application/json"
}

// localCaller reports whether r comes from this host and names it: from loopback without a
// proxy's forwarding headers (isLocal), with a Host that is this host's (ownHost). The second
// check keeps a web page whose own name was rebound to 127.0.0.1 from reading the admin answers.
func (a *API) localCaller(r *http.Request) bool { return isLocal(r) && a.ownHost(r.Host) }

// ownHost reports whether the Host value names this host: localhost, a loopback address, or one
// of Options.OwnHosts (--host, the machine's name), on any port.
func (a *API) ownHost(host string) bool {
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	host = strings.TrimSuffix(strings.Trim(host, "[]"), ".")
	if strings.EqualFold(host, "localhost") {
		return true
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return true
	}
	for _, own := range a.opts.OwnHosts {
		if own != "" && strings.EqualFold(own, host) {
			return true
		}
	}
	return false
}

// clientAuth guards a non-routed client endpoint (/v1/models) with the client keys, when set.
func (a *API) clientAuth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if a.opts.ClientKeys != nil {
			if _, ok := a.opts.ClientKeys.Lookup(clientkeys.FromHeaders(r.Header.Get)); !ok {
				proxy.WriteError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "a valid API key is required")
				return
			}
		}
		h(w, r)
	}
}

// isLocal reports whether r comes straight from this host's loopback: its peer address is a
// loopback one and it carries no X-Forwarded-For or Forwarded header, which a reverse proxy on
// this host would add for a remote client.
func isLocal(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback() && r.Header.Get(proxy.HeaderForwardedFor) == "" && r.Header.Get("Forwarded") == ""
}

// isAdmin reports whether r carries the admin key as a bearer token. The scheme name is matched
// case-insensitively (RFC 9110 section 11.1).
func (a *API) isAdmin(r *http.Request) bool {
	if a.opts.AdminAPIKey == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(bearerToken(r.Header.Get("Authorization"))), []byte(a.opts.AdminAPIKey)) == 1
}

// bearerToken returns the token of an Authorization header value with the Bearer scheme, in any
// letter case, or "".
func bearerToken(v string) string {
	scheme, token, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(token)
}

func (a *API) listWorkers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"workers": a.describeWorkers(a.opts.Pool.All())})
}

// addRequest is what an admin request asks to add: a worker URL, its role, and the KV-cache event
// endpoints it names for itself.
type addRequest struct {
	URL            string `json:"url"`
	Role           string `json:"role"`
	KVEvents       string `json:"kv_events_endpoint"`
	KVEventsReplay string `json:"kv_events_replay_endpoint"`
}

// addRequestFromQuery reads an addRequest from ?url=&role=&kv_events_endpoint=&kv_events_replay_endpoint=.
func addRequestFromQuery(q url.Values) addRequest {
	return addRequest{URL: q.Get("url"), Role: q.Get("role"), KVEvents: q.Get("kv_events_endpoint"), KVEventsReplay: q.Get("kv_events_replay_endpoint")}
}

func (a *API) addWorkerQuery(w http.ResponseWriter, r *http.Request) {
	a.addWorker(w, r, addRequestFromQuery(r.URL.Query()))
}

// addWorkerREST takes the worker from the query (see addRequestFromQuery) or from a JSON body
// {"url": "...", "role": "...", "kv_events_endpoint": "...", "kv_events_replay_endpoint": "..."}.
func (a *API) addWorkerREST(w http.ResponseWriter, r *http.Request) {
	add := addRequestFromQuery(r.URL.Query())
	if add.URL == "" {
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&add); err != nil {
			proxy.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "expected ?url= or a JSON body {\"url\": \"...\"}")
			return
		}
	}
	a.addWorker(w, r, add)
}

// addWorker joins a worker through the fleet, in its role (colocated when empty), and answers
// once its first probe is done. A worker that is unreachable stays registered and listed as
// unhealthy; health checks bring it in when it comes up. A worker that another source (the
// static list, discovery) holds in the same role gains the admin API as a holder, so discovery
// no longer removes it. Event endpoints of its own are subscribed to within a second, in place of
// the --kv-events-endpoint template's, once their host passes --worker-url-allow; endpoints that
// cannot be used, or a router that subscribes to no events, refuse the worker with 400.
func (a *API) addWorker(w http.ResponseWriter, r *http.Request, add addRequest) {
	url, err := tenant.ParseURL(add.URL)
	if err != nil {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_worker_url", err.Error())
		return
	}
	if url.HasCredentials() && !a.opts.AdminURLCredentials {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_worker_url",
			"a worker URL added through the admin API may not carry user:password@ (see --admin-worker-url-credentials)")
		return
	}
	role, err := workers.ParseRole(add.Role)
	if err != nil {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_worker_role", truncate(err.Error(), 300))
		return
	}
	ev := kvevents.WorkerEndpoints{Events: add.KVEvents, Replay: add.KVEventsReplay}
	if !ev.IsZero() && a.opts.KVEvents == nil {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request_error", "kv_events_off",
			"this router subscribes to no KV-cache events: start it with --kv-events-endpoint, --kv-events-worker-endpoints or --kv-events-bind to give a worker its own")
		return
	}
	joined, err := a.opts.Fleet.Join(r.Context(), fleet.Admin, url, role, ev)
	switch {
	case errors.Is(err, fleet.ErrKVEvents):
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_kv_events_endpoint", truncate(err.Error(), 300))
		return
	case errors.Is(err, fleet.ErrExists):
		proxy.WriteError(w, http.StatusConflict, "invalid_request_error", "worker_exists", "worker "+url.Redacted()+" is already registered")
		return
	case errors.Is(err, fleet.ErrRoleConflict):
		proxy.WriteError(w, http.StatusConflict, "invalid_request_error", "worker_role_conflict", err.Error())
		return
	case errors.Is(err, tenant.ErrNotAllowed):
		proxy.WriteError(w, http.StatusForbidden, "permission_error", "worker_not_allowed", err.Error())
		return
	case err != nil:
		proxy.WriteError(w, http.StatusInternalServerError, "server_error", "add_worker_failed", err.Error())
		return
	}
	select {
	case <-joined.Probed:
	case <-r.Context().Done():
	}
	writeJSON(w, http.StatusOK, map[string]any{"added": url.Redacted(), "workers": a.describeWorkers(a.opts.Pool.Get(url.String()))})
}

func (a *API) removeWorkerQuery(w http.ResponseWriter, r *http.Request) {
	a.removeWorker(w, r.URL.Query().Get("url"))
}

func (a *API) deleteWorker(w http.ResponseWriter, r *http.Request) {
	a.removeWorker(w, r.PathValue("url"))
}

// removeWorker takes a worker out of the fleet whichever sources joined it: the operator's word
// overrides theirs. A discovery source that still reports it joins it again at its next report.
func (a *API) removeWorker(w http.ResponseWriter, raw string) {
	url, err := tenant.ParseURL(raw)
	if err != nil {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_worker_url", err.Error())
		return
	}
	if err := a.opts.Fleet.Remove(url); err != nil {
		if errors.Is(err, fleet.ErrNotFound) {
			proxy.WriteError(w, http.StatusNotFound, "invalid_request_error", "worker_not_found", "worker "+url.Redacted()+" is not registered")
			return
		}
		proxy.WriteError(w, http.StatusInternalServerError, "server_error", "remove_worker_failed", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"removed": url.Redacted()})
}

func (a *API) getWorker(w http.ResponseWriter, r *http.Request) {
	url, err := tenant.NormalizeURL(r.PathValue("url"))
	if err != nil {
		proxy.WriteError(w, http.StatusBadRequest, "invalid_request_error", "invalid_worker_url", err.Error())
		return
	}
	tenants := a.opts.Pool.Get(url)
	if len(tenants) == 0 {
		proxy.WriteError(w, http.StatusNotFound, "invalid_request_error", "worker_not_found", "worker "+tenant.Redact(url)+" is not registered")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"workers": a.describeWorkers(tenants)})
}

// truncate bounds a caller's string as an error message shows it.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
