// Package kubetest is an in-process Kubernetes API server for tests: it serves the list and the
// watch of pods (resource versions, label selectors, bookmarks, 410 Gone for a version it no
// longer holds, watches ended on demand) over loopback HTTP or HTTPS, checks a bearer token when
// given one, and records every request it gets.
package kubetest

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/kubeapi"
)

// Request is one request the server got.
type Request struct {
	Watch           bool // a watch; else a list
	Namespace       string
	Selector        string
	ResourceVersion string
	Continue        string
	Bookmarks       bool
	TimeoutSeconds  string
	Authorization   string
	Status          int // what it was answered
}

// Server is the fake API server. Its methods may be called from any goroutine.
type Server struct {
	*httptest.Server

	mu        sync.Mutex
	rv        int64
	pods      map[string]kubeapi.Pod // namespace/name → pod
	history   []change               // every change after oldest
	oldest    int64                  // a watch from before this version is answered 410
	watches   map[*watcher]bool
	held      bool // changes are kept from the open watches
	token     string
	listError *kubeapi.Status
	requests  []Request
	notify    chan struct{} // ticks when a request is recorded
}

type change struct {
	rv       int64
	typ      kubeapi.EventType
	old, new *kubeapi.Pod // old nil for an addition, new nil for a deletion
}

type watcher struct {
	ns     string
	sel    kubeapi.Selector
	events chan []byte // encoded events; closed to end the watch
	closed bool
}

// Client is a client of s, trusting its certificate when it serves HTTPS.
func (s *Server) Client(t testing.TB) *kubeapi.Client {
	t.Helper()
	cfg := kubeapi.Config{Server: s.URL}
	if s.TLS != nil {
		roots := x509.NewCertPool()
		roots.AddCert(s.Certificate())
		cfg.TLS = &tls.Config{RootCAs: roots}
	}
	c, err := kubeapi.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// New starts a plain-HTTP server on 127.0.0.1, closed when the test ends.
func New(t testing.TB) *Server { return start(t, false, nil) }

// NewTLS starts an HTTPS server on 127.0.0.1 (its certificate: s.Certificate()); setup, when not
// nil, changes its TLS configuration first (to ask for client certificates, say).
func NewTLS(t testing.TB, setup func(*tls.Config)) *Server { return start(t, true, setup) }

func start(t testing.TB, useTLS bool, setup func(*tls.Config)) *Server {
	s := &Server{rv: 100, oldest: 100, pods: map[string]kubeapi.Pod{}, watches: map[*watcher]bool{}, notify: make(chan struct{}, 1)}
	s.Server = httptest.NewUnstartedServer(http.HandlerFunc(s.serve))
	if useTLS {
		s.TLS = &tls.Config{}
		if setup != nil {
			setup(s.TLS)
		}
		s.StartTLS()
	} else {
		s.Start()
	}
	t.Cleanup(func() {
		s.EndWatches()
		s.Close()
	})
	return s
}

// SetToken makes the server accept only requests with "Authorization: Bearer token" ("" accepts
// any request).
func (s *Server) SetToken(token string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.token = token
}

// RefuseLists answers every list with st (nil: lists work again).
func (s *Server) RefuseLists(st *kubeapi.Status) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.listError = st
}

// Pod is a running pod in ns with the given IP ("" for none yet), Ready condition and labels
// (key, value, key, value …).
func Pod(ns, name, ip string, ready bool, labels ...string) kubeapi.Pod {
	var p kubeapi.Pod
	p.Metadata.Name, p.Metadata.Namespace = name, ns
	p.Metadata.Labels = map[string]string{}
	for i := 0; i+1 < len(labels); i += 2 {
		p.Metadata.Labels[labels[i]] = labels[i+1]
	}
	p.Status.Phase, p.Status.PodIP = "Running", ip
	SetReady(&p, ready)
	return p
}

// SetReady sets p's Ready condition (beside a PodScheduled one).
func SetReady(p *kubeapi.Pod, ready bool) {
	st := "False"
	if ready {
		st = "True"
	}
	p.Status.Conditions = []kubeapi.PodCondition{{Type: "PodScheduled", Status: "True"}, {Type: "Ready", Status: st}}
}

// Terminate marks p as being deleted, as kubectl delete does before the pod is gone.
func Terminate(p *kubeapi.Pod) {
	now := time.Now().UTC().Format(time.RFC3339)
	p.Metadata.DeletionTimestamp = &now
}

// Create adds p (or replaces it, as an update, when it exists).
func (s *Server) Create(p kubeapi.Pod) { s.put(p) }

// Update replaces the pod of p's namespace and name with p.
func (s *Server) Update(p kubeapi.Pod) { s.put(p) }

func (s *Server) put(p kubeapi.Pod) {
	s.mu.Lock()
	defer s.mu.Unlock()
	key := p.Metadata.Namespace + "/" + p.Metadata.Name
	s.rv++
	p.Metadata.ResourceVersion = strconv.FormatInt(s.rv, 10)
	p.Metadata.Labels = maps.Clone(p.Metadata.Labels)
	c := change{rv: s.rv, typ: kubeapi.Added, new: &p}
	if old, ok := s.pods[key]; ok {
		c.typ, c.old = kubeapi.Modified, &old
	} else {
		p.Metadata.UID = fmt.Sprintf("uid-%d", s.rv)
	}
	s.pods[key] = p
	s.record(c)
}

// Delete removes the pod ns/name; it reports whether there was one.
func (s *Server) Delete(ns, name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok := s.pods[ns+"/"+name]
	if !ok {
		return false
	}
	delete(s.pods, ns+"/"+name)
	s.rv++
	old.Metadata.ResourceVersion = strconv.FormatInt(s.rv, 10)
	s.record(change{rv: s.rv, typ: kubeapi.Deleted, old: &old})
	return true
}

// Hold keeps changes from the open watches from now on, as a watch that has gone stale would,
// until Expire or EndWatches ends them.
func (s *Server) Hold() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = true
}

// Expire forgets every change so far, so that a watch from any version before now is answered
// 410 Gone, and ends the open watches with an ERROR event of code 410, as an API server does
// when a watch falls behind what etcd still holds.
func (s *Server) Expire() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.history, s.oldest, s.held = nil, s.rv, false
	gone, _ := json.Marshal(map[string]any{"type": "ERROR", "object": kubeapi.Status{
		Kind: "Status", Status: "Failure", Code: 410, Reason: "Expired", Message: "too old resource version",
	}})
	for w := range s.watches {
		s.send(w, gone)
		s.end(w)
	}
}

// Compact forgets every change so far without touching the open watches: a watch started later
// from an older version is answered 410 Gone.
func (s *Server) Compact() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.history, s.oldest = nil, s.rv
}

// Bookmark sends every open watch a BOOKMARK at the current version, after a change the watch
// does not see (a pod of another namespace), as the API server does every minute or so.
func (s *Server) Bookmark() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rv++
	var p kubeapi.Pod
	p.Metadata.ResourceVersion = strconv.FormatInt(s.rv, 10)
	b, _ := json.Marshal(map[string]any{"type": kubeapi.Bookmark, "object": p})
	for w := range s.watches {
		s.send(w, b)
	}
}

// EndWatches ends every open watch in order, as the API server does at the end of its
// timeoutSeconds; the watches opened next get every change again.
func (s *Server) EndWatches() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.held = false
	for w := range s.watches {
		s.end(w)
	}
}

// Version is the current resource version.
func (s *Server) Version() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return strconv.FormatInt(s.rv, 10)
}

// Requests is every request so far, in order.
func (s *Server) Requests() []Request {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.requests)
}

// WaitFor waits up to 10 s until the requests so far satisfy cond, and returns them.
func (s *Server) WaitFor(t testing.TB, what string, cond func([]Request) bool) []Request {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if rs := s.Requests(); cond(rs) {
			return rs
		}
		select {
		case <-s.notify:
		case <-deadline:
			t.Fatalf("timed out waiting for %s; requests %+v", what, s.Requests())
		}
	}
}

// Watches counts the watches among rs.
func Watches(rs []Request) int {
	n := 0
	for _, r := range rs {
		if r.Watch && r.Status == http.StatusOK {
			n++
		}
	}
	return n
}

// record appends c to the history and sends it to the open watches it concerns. s.mu is held.
func (s *Server) record(c change) {
	s.history = append(s.history, c)
	if s.held {
		return
	}
	for w := range s.watches {
		if b := w.encode(c); b != nil {
			s.send(w, b)
		}
	}
}

// encode is c as w sees it: a pod that starts or stops matching w's selector is an addition or
// a deletion; nil for a change w does not see.
func (w *watcher) encode(c change) []byte {
	in := func(p *kubeapi.Pod) bool {
		return p != nil && p.Metadata.Namespace == w.ns && w.sel.Matches(p.Metadata.Labels)
	}
	typ, obj := c.typ, c.new
	switch oldIn, newIn := in(c.old), in(c.new); {
	case oldIn && newIn:
	case newIn:
		typ = kubeapi.Added
	case oldIn:
		typ, obj = kubeapi.Deleted, c.old
		if c.new != nil {
			obj = c.new
		}
	default:
		return nil
	}
	b, _ := json.Marshal(map[string]any{"type": typ, "object": obj})
	return b
}

// send queues b on w, ending w when it cannot keep up. s.mu is held.
func (s *Server) send(w *watcher, b []byte) {
	if w.closed {
		return
	}
	select {
	case w.events <- b:
	default:
		s.end(w)
	}
}

func (s *Server) end(w *watcher) {
	if !w.closed {
		w.closed = true
		close(w.events)
	}
	delete(s.watches, w)
}

func (s *Server) serve(rw http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	req := Request{
		Watch: q.Get("watch") == "true", Selector: q.Get("labelSelector"), ResourceVersion: q.Get("resourceVersion"),
		Continue: q.Get("continue"), Bookmarks: q.Get("allowWatchBookmarks") == "true", TimeoutSeconds: q.Get("timeoutSeconds"),
		Authorization: r.Header.Get("Authorization"),
	}
	answer := func(st kubeapi.Status) {
		req.Status = st.Code
		s.log(req)
		st.Kind, st.Status = "Status", "Failure"
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(st.Code)
		_ = json.NewEncoder(rw).Encode(st)
	}
	parts := strings.Split(strings.Trim(r.URL.Path, "/"), "/")
	if r.Method != http.MethodGet || len(parts) != 5 || parts[0] != "api" || parts[1] != "v1" || parts[2] != "namespaces" || parts[4] != "pods" {
		answer(kubeapi.Status{Code: http.StatusNotFound, Reason: "NotFound", Message: "only the pods of a namespace are served here"})
		return
	}
	req.Namespace = parts[3]
	s.mu.Lock()
	token, listError := s.token, s.listError
	s.mu.Unlock()
	if token != "" && req.Authorization != "Bearer "+token {
		answer(kubeapi.Status{Code: http.StatusUnauthorized, Reason: "Unauthorized", Message: "Unauthorized"})
		return
	}
	sel, err := kubeapi.ParseSelector(req.Selector)
	if err != nil {
		answer(kubeapi.Status{Code: http.StatusBadRequest, Reason: "BadRequest", Message: err.Error()})
		return
	}
	if !req.Watch {
		if listError != nil {
			answer(*listError)
			return
		}
		s.list(rw, req, sel, q.Get("limit"))
		return
	}
	s.watch(rw, r, req, sel)
}

func (s *Server) log(req Request) {
	s.mu.Lock()
	s.requests = append(s.requests, req)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

func (s *Server) list(rw http.ResponseWriter, req Request, sel kubeapi.Selector, limit string) {
	s.mu.Lock()
	var items []kubeapi.Pod
	for _, key := range slices.Sorted(maps.Keys(s.pods)) {
		if p := s.pods[key]; p.Metadata.Namespace == req.Namespace && sel.Matches(p.Metadata.Labels) {
			items = append(items, p)
		}
	}
	var list kubeapi.PodList
	list.Metadata.ResourceVersion = strconv.FormatInt(s.rv, 10)
	s.mu.Unlock()
	from, _ := strconv.Atoi(req.Continue)
	n, err := strconv.Atoi(limit)
	if err != nil || n <= 0 {
		n = len(items)
	}
	from = min(from, len(items))
	to := min(from+n, len(items))
	list.Items = items[from:to]
	if to < len(items) {
		list.Metadata.Continue = strconv.Itoa(to)
	}
	req.Status = http.StatusOK
	s.log(req)
	rw.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(rw).Encode(list)
}

func (s *Server) watch(rw http.ResponseWriter, r *http.Request, req Request, sel kubeapi.Selector) {
	from, err := strconv.ParseInt(req.ResourceVersion, 10, 64)
	timeout, terr := strconv.Atoi(req.TimeoutSeconds)
	if err != nil || terr != nil || timeout <= 0 {
		req.Status = http.StatusBadRequest
		s.log(req)
		http.Error(rw, "want a resourceVersion and timeoutSeconds", http.StatusBadRequest)
		return
	}
	s.mu.Lock()
	if from < s.oldest {
		s.mu.Unlock()
		req.Status = http.StatusGone
		s.log(req)
		rw.Header().Set("Content-Type", "application/json")
		rw.WriteHeader(http.StatusGone)
		_ = json.NewEncoder(rw).Encode(kubeapi.Status{Kind: "Status", Status: "Failure", Code: 410, Reason: "Expired", Message: "too old resource version"})
		return
	}
	w := &watcher{ns: req.Namespace, sel: sel, events: make(chan []byte, 1024)}
	for _, c := range s.history {
		if c.rv > from {
			if b := w.encode(c); b != nil {
				s.send(w, b)
			}
		}
	}
	if !w.closed {
		s.watches[w] = true
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.end(w)
		s.mu.Unlock()
	}()
	rw.Header().Set("Content-Type", "application/json")
	rw.WriteHeader(http.StatusOK)
	rw.(http.Flusher).Flush()
	req.Status = http.StatusOK
	s.log(req)
	end := time.NewTimer(time.Duration(timeout) * time.Second)
	defer end.Stop()
	for {
		select {
		case b, ok := <-w.events:
			if !ok {
				return
			}
			_, _ = rw.Write(append(b, '\n'))
			rw.(http.Flusher).Flush()
		case <-end.C:
			return
		case <-r.Context().Done():
			return
		}
	}
}

// CertificatePEM is the server's certificate in PEM, as a cluster's ca.crt holds it.
func (s *Server) CertificatePEM() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: s.Certificate().Raw})
}
