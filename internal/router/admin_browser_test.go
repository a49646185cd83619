package router

import (
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
)

// What a web page in a browser on an admin's machine can make the router do: nothing that
// changes it, and nothing that reads the fleet's topology.

// adminCall sends one admin request to the router and returns its status and body.
func adminCall(t *testing.T, tr *testRouter, method, path, body string, header ...string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, tr.url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i+1 < len(header); i += 2 {
		if header[i] == "Host" {
			req.Host = header[i+1]
			continue
		}
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, readAll(t, resp)
}

func TestCrossSiteFormPostCannotRegisterAWorker(t *testing.T) {
	first, attacker := newFakeWorker(t), newFakeWorker(t)
	for _, key := range []string{"", "adm1n"} {
		cfg := testConfig()
		cfg.AdminAPIKey = key
		tr := startRouter(t, cfg, first)
		auth := []string{}
		if key != "" {
			auth = []string{"Authorization", "Bearer " + key}
		}
		form := "url=" + url.QueryEscape(attacker.URL())
		for _, c := range []struct {
			name   string
			path   string
			body   string
			header []string
			status int
			code   string
		}{
			{"a form to /add_worker from another site", "/add_worker?url=" + url.QueryEscape(attacker.URL()), form,
				[]string{"Content-Type", "application/x-www-form-urlencoded", "Origin", "http://evil.example"}, http.StatusForbidden, "admin_origin_not_allowed"},
			{"a JSON body from another site", "/workers", `{"url":"` + attacker.URL() + `"}`,
				[]string{"Content-Type", "application/json", "Origin", "http://evil.example"}, http.StatusForbidden, "admin_origin_not_allowed"},
			{"a sandboxed page (Origin: null)", "/workers?url=" + url.QueryEscape(attacker.URL()), "",
				[]string{"Origin", "null"}, http.StatusForbidden, "admin_origin_not_allowed"},
			{"a page known by its Referer only", "/workers?url=" + url.QueryEscape(attacker.URL()), "",
				[]string{"Referer", "http://evil.example/page.html"}, http.StatusForbidden, "admin_origin_not_allowed"},
			{"a text/plain body without Origin", "/workers", `{"url":"` + attacker.URL() + `"}`,
				[]string{"Content-Type", "text/plain"}, http.StatusUnsupportedMediaType, "unsupported_media_type"},
			{"a form body without Origin", "/add_worker?url=" + url.QueryEscape(attacker.URL()), form,
				[]string{"Content-Type", "application/x-www-form-urlencoded"}, http.StatusUnsupportedMediaType, "unsupported_media_type"},
		} {
			status, body := adminCall(t, tr, http.MethodPost, c.path, c.body, append(c.header, auth...)...)
			if status != c.status || !strings.Contains(body, c.code) {
				t.Errorf("key %q, %s: %d %s, want %d %s", key, c.name, status, body, c.status, c.code)
			}
		}
		if got := tr.Pool().URLs(); !slices.Equal(got, []string{first.URL()}) {
			t.Fatalf("key %q: the pool is %q after the refused requests", key, got)
		}
		// The same request from curl or a script (no Origin, no Referer, no form type) still works.
		if status, body := adminCall(t, tr, http.MethodPost, "/add_worker?url="+url.QueryEscape(attacker.URL()), "", auth...); status != http.StatusOK {
			t.Fatalf("key %q: POST /add_worker from a script: %d %s", key, status, body)
		}
	}
	if n := attacker.hits.Load(); n != 0 {
		t.Fatalf("the worker the pages tried to add received %d routed requests", n)
	}
}

func TestAdminAllowedOriginsLetsThatPageChangeTheRouter(t *testing.T) {
	first, added := newFakeWorker(t), newFakeWorker(t)
	cfg := testConfig()
	cfg.AdminAllowedOrigins = []string{"https://ops.example"}
	tr := startRouter(t, cfg, first)
	if status, body := adminCall(t, tr, http.MethodPost, "/workers", `{"url":"`+added.URL()+`"}`,
		"Content-Type", "application/json", "Origin", "https://ops.example"); status != http.StatusOK {
		t.Fatalf("from an allowed origin: %d %s, want 200", status, body)
	}
	if status, body := adminCall(t, tr, http.MethodDelete, "/workers/"+url.PathEscape(added.URL()), "",
		"Origin", "https://other.example"); status != http.StatusForbidden {
		t.Fatalf("from another origin: %d %s, want 403", status, body)
	}
}

func TestAdminPlaneWithoutAKeyRefusesAHostThatIsNotThisHost(t *testing.T) {
	w := newFakeWorker(t)
	tr := startRouter(t, testConfig(), w)
	port := tr.url[strings.LastIndex(tr.url, ":")+1:]
	// A page on evil.example whose name now resolves to 127.0.0.1 (DNS rebinding) reads as the
	// same origin as the router to the browser; only the Host header tells it apart.
	for _, path := range []string{"/workers", "/list_workers", "/workers/" + url.PathEscape(w.URL()), "/metrics"} {
		status, body := adminCall(t, tr, http.MethodGet, path, "", "Host", "evil.example:"+port)
		if status != http.StatusForbidden || !strings.Contains(body, "admin_host_not_allowed") || strings.Contains(body, w.URL()) {
			t.Errorf("GET %s with Host evil.example: %d %s, want 403 admin_host_not_allowed without the worker's URL", path, status, body)
		}
	}
	if _, body := adminCall(t, tr, http.MethodGet, "/health", "", "Host", "evil.example:"+port); strings.Contains(body, w.URL()) {
		t.Errorf("/health with Host evil.example shows the worker's URL: %s", body)
	}
	for _, host := range []string{"localhost:" + port, "127.0.0.1:" + port, "LOCALHOST"} {
		if status, body := adminCall(t, tr, http.MethodGet, "/workers", "", "Host", host); status != http.StatusOK || !strings.Contains(body, w.URL()) {
			t.Errorf("GET /workers with Host %s: %d %s, want 200 with the worker", host, status, body)
		}
	}
}

func TestMetricsOnTheTrafficPortNeedTheAdminKey(t *testing.T) {
	w := newFakeWorker(t)
	cfg := testConfig()
	cfg.AdminAPIKey = "adm1n"
	tr := startRouter(t, cfg, w)
	readAll(t, tr.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`))
	if status, body := adminCall(t, tr, http.MethodGet, "/metrics", ""); status != http.StatusUnauthorized || strings.Contains(body, w.URL()) {
		t.Fatalf("GET /metrics without the key: %d, want 401 without worker URLs: %s", status, body)
	}
	status, body := adminCall(t, tr, http.MethodGet, "/metrics", "", "Authorization", "Bearer adm1n")
	if status != http.StatusOK || !strings.Contains(body, w.URL()) {
		t.Fatalf("GET /metrics with the key: %d, want 200 with the worker's series", status)
	}
}

func TestAdminAnswersCarryNoCORSHeaders(t *testing.T) {
	cfg := testConfig()
	cfg.CORSAllowedOrigins = []string{"*"}
	tr := startRouter(t, cfg, newFakeWorker(t))
	get := func(path string) http.Header {
		req, _ := http.NewRequest(http.MethodGet, tr.url+path, nil)
		req.Header.Set("Origin", "https://page.example")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		return resp.Header
	}
	for _, path := range []string{"/workers", "/metrics", "/list_workers"} {
		if v := get(path).Get("Access-Control-Allow-Origin"); v != "" {
			t.Errorf("GET %s to a page: Access-Control-Allow-Origin %q, want none", path, v)
		}
	}
	if v := get("/v1/models").Get("Access-Control-Allow-Origin"); v != "*" {
		t.Errorf("GET /v1/models to a page: Access-Control-Allow-Origin %q, want *", v)
	}
}

// The configuration names the router's own listen address as one of its hosts.
func TestOwnHostsNameTheListenAddressUnlessItIsAWildcard(t *testing.T) {
	if hosts := ownHosts("router.example"); !slices.Contains(hosts, "router.example") {
		t.Errorf("ownHosts(router.example) = %q", hosts)
	}
	for _, wildcard := range []string{"0.0.0.0", "::", ""} {
		if hosts := ownHosts(wildcard); slices.Contains(hosts, wildcard) {
			t.Errorf("ownHosts(%q) = %q: a wildcard is no name of this host", wildcard, hosts)
		}
	}
}
