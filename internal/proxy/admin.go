package proxy

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/cacheroute/cacheroute/internal/clientkeys"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// admin guards an admin endpoint. When an admin key is configured, the request must carry it as
// a bearer token (compared in constant time). Without one, the admin plane is closed to every
// caller but a local one (see isLocal): an open port must never let a client add a worker that
// would then receive other clients' prompts and the router's worker key.
func (s *Server) admin(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		switch {
		case s.opts.AdminAPIKey != "" && !s.isAdmin(r):
			writeError(w, http.StatusUnauthorized, "authentication_error", "invalid_admin_api_key", "admin endpoints require a valid admin API key")
			return
		case s.opts.AdminAPIKey == "" && !isLocal(r):
			writeError(w, http.StatusForbidden, "permission_error", "admin_loopback_only",
				"without --admin-api-key the admin endpoints answer only callers on this host's loopback")
			return
		}
		h(w, r)
	}
}

// clientAuth guards a non-routed client endpoint (/v1/models) with the client keys, when set.
func (s *Server) clientAuth(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if s.opts.ClientKeys != nil {
			if _, ok := s.opts.ClientKeys.Lookup(clientkeys.FromHeaders(r.Header.Get)); !ok {
				writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_api_key", "a valid API key is required")
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
	return ip != nil && ip.IsLoopback() && r.Header.Get(HeaderForwardedFor) == "" && r.Header.Get("Forwarded") == ""
}

// isAdmin reports whether r carries the admin key as a bearer token. The scheme name is matched
// case-insensitively (RFC 9110 section 11.1).
func (s *Server) isAdmin(r *http.Request) bool {
	if s.opts.AdminAPIKey == "" {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(bearerToken(r.Header.Get("Authorization"))), []byte(s.opts.AdminAPIKey)) == 1
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

func (s *Server) listWorkers(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{"workers": describeWorkers(s.pool.All())})
}

func (s *Server) addWorkerQuery(w http.ResponseWriter, r *http.Request) {
	s.addWorker(w, r, r.URL.Query().Get("url"))
}

// addWorkerREST takes the URL from ?url= or from a JSON body {"url": "..."}.
func (s *Server) addWorkerREST(w http.ResponseWriter, r *http.Request) {
	url := r.URL.Query().Get("url")
	if url == "" {
		var body struct {
			URL string `json:"url"`
		}
		if err := json.NewDecoder(io.LimitReader(r.Body, 1<<16)).Decode(&body); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_json", "expected ?url= or a JSON body {\"url\": \"...\"}")
			return
		}
		url = body.URL
	}
	s.addWorker(w, r, url)
}

// addWorker registers and probes a worker. A worker that is unreachable stays registered and
// listed as unhealthy; health checks bring it in when it comes up.
func (s *Server) addWorker(w http.ResponseWriter, r *http.Request, url string) {
	url, err := tenant.NormalizeURL(url)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_worker_url", err.Error())
		return
	}
	if tenant.Redact(url) != url && !s.opts.AdminURLCredentials {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_worker_url",
			"a worker URL added through the admin API may not carry user:password@ (see --admin-worker-url-credentials)")
		return
	}
	if err := s.fleet.AddWorker(r.Context(), url); err != nil {
		if errors.Is(err, workers.ErrExists) {
			writeError(w, http.StatusConflict, "invalid_request_error", "worker_exists", "worker "+tenant.Redact(url)+" is already registered")
			return
		}
		if errors.Is(err, tenant.ErrNotAllowed) {
			writeError(w, http.StatusForbidden, "permission_error", "worker_not_allowed", err.Error())
			return
		}
		writeError(w, http.StatusInternalServerError, "server_error", "add_worker_failed", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"added": tenant.Redact(url), "workers": describeWorkers(s.pool.Get(url))})
}

func (s *Server) removeWorkerQuery(w http.ResponseWriter, r *http.Request) {
	s.removeWorker(w, r.URL.Query().Get("url"))
}

func (s *Server) deleteWorker(w http.ResponseWriter, r *http.Request) {
	s.removeWorker(w, r.PathValue("url"))
}

func (s *Server) removeWorker(w http.ResponseWriter, raw string) {
	url, err := tenant.NormalizeURL(raw)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_worker_url", err.Error())
		return
	}
	if err := s.fleet.RemoveWorker(url); err != nil {
		if errors.Is(err, workers.ErrNotFound) {
			writeError(w, http.StatusNotFound, "invalid_request_error", "worker_not_found", "worker "+tenant.Redact(url)+" is not registered")
			return
		}
		writeError(w, http.StatusInternalServerError, "server_error", "remove_worker_failed", err.Error())
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"removed": tenant.Redact(url)})
}

func (s *Server) getWorker(w http.ResponseWriter, r *http.Request) {
	url, err := tenant.NormalizeURL(r.PathValue("url"))
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_worker_url", err.Error())
		return
	}
	tenants := s.pool.Get(url)
	if len(tenants) == 0 {
		writeError(w, http.StatusNotFound, "invalid_request_error", "worker_not_found", "worker "+tenant.Redact(url)+" is not registered")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"workers": describeWorkers(tenants)})
}
