package haproxyproc

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

// requireHAProxy skips a test when haproxy is not installed.
func requireHAProxy(t *testing.T) {
	t.Helper()
	p, err := Start(Config{Workers: []string{"http://127.0.0.1:1"}})
	if errors.Is(err, ErrNotInstalled) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	p.Close()
}

// backends starts n loopback servers that answer with their index.
func backends(t *testing.T, n int) []string {
	var urls []string
	for i := range n {
		s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, i) }))
		t.Cleanup(s.Close)
		urls = append(urls, s.URL)
	}
	return urls
}

func get(t *testing.T, url, session string) string {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	if session != "" {
		req.Header.Set("x-session-id", session)
	}
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestProxy_StickTableKeepsASessionOnItsFirstWorker(t *testing.T) {
	requireHAProxy(t)
	p, err := Start(Config{Workers: backends(t, 3), StickHeader: "x-session-id"})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	first := map[string]string{}
	for round := range 4 {
		for _, s := range []string{"a", "b", "c", "d"} {
			got := get(t, p.URL(), s)
			if round == 0 {
				first[s] = got
			} else if got != first[s] {
				t.Fatalf("session %s went to worker %s, then %s", s, first[s], got)
			}
		}
	}
	if first["a"] == first["b"] && first["b"] == first["c"] {
		t.Fatalf("new sessions were not balanced: %v", first)
	}
}

func TestProxy_WithoutAStickHeaderBalancesEveryRequest(t *testing.T) {
	requireHAProxy(t)
	p, err := Start(Config{Workers: backends(t, 2)})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if a, b := get(t, p.URL(), "a"), get(t, p.URL(), "a"); a == b {
		t.Fatalf("one session's two requests both went to %s without stickiness", a)
	}
}

func TestStart_RefusesWorkersBeyondLoopbackAndBadHeaders(t *testing.T) {
	requireHAProxy(t)
	for _, c := range []Config{
		{Workers: []string{"http://worker:80"}}, // a name, not a loopback address
		{Workers: []string{"127.0.0.1:80"}},
		{Workers: []string{"http://127.0.0.1:80"}, StickHeader: "x-a) or (1"},
		{},
	} {
		if p, err := Start(c); err == nil {
			p.Close()
			t.Fatalf("started with %+v", c)
		} else if !strings.Contains(err.Error(), "want") && !strings.Contains(err.Error(), "loopback") && !strings.Contains(err.Error(), "header") && !strings.Contains(err.Error(), "no worker") {
			t.Fatalf("%+v: %v", c, err)
		}
	}
}
