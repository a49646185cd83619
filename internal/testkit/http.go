package testkit

import (
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// Send sends a request with client (http.DefaultClient when nil): a JSON body when body is not
// empty, then header as name, value pairs. It returns the answer's status, headers and whole
// body, failing t when there is no answer.
func Send(t testing.TB, client *http.Client, method, url, body string, header ...string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range Header(header...) {
		req.Header[k] = v
	}
	if client == nil {
		client = http.DefaultClient
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s %s: reading the body: %v", method, url, err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// Header is a header set from name, value pairs, its keys canonical as net/http stores them.
func Header(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Set(kv[i], kv[i+1])
	}
	return h
}

// Server is an httptest server on loopback that counts the requests it receives.
type Server struct {
	*httptest.Server
	Hits atomic.Int64
}

// NewServer serves h until the test ends.
func NewServer(t testing.TB, h http.HandlerFunc) *Server {
	t.Helper()
	s := &Server{}
	s.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.Hits.Add(1)
		h(w, r)
	}))
	t.Cleanup(s.Close)
	return s
}

// NamedServer answers every request with status and the JSON body {"worker":name}, after
// reading the request's body: a worker whose answers say which one it was.
func NamedServer(t testing.TB, status int, name string) *Server {
	t.Helper()
	return NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = fmt.Fprintf(w, `{"worker":%q}`, name)
	})
}
