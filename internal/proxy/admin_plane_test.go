package proxy

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The admin plane without an admin key: open to callers on this host's loopback only.

// remoteAdmin sends an admin request to the router's handlers as if it came from addr, which the
// network tests cannot do (they use loopback only).
func remoteAdmin(tp *testProxy, method, path, body, addr string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.RemoteAddr = addr
	rec := httptest.NewRecorder()
	tp.Server.mux.ServeHTTP(rec, req)
	return rec
}

func TestAdminPlaneRefusesARemoteCallerAddingAWorkerWithoutAKey(t *testing.T) {
	fleet := &probeRecorder{}
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "w").URL}, fleet: fleet})
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/workers", `{"url":"http://attacker.example:8000"}`},
		{http.MethodPost, "/add_worker?url=http://attacker.example:8000", ""},
		{http.MethodGet, "/workers", ""},
		{http.MethodGet, "/list_workers", ""},
		{http.MethodPost, "/remove_worker?url=" + tp.Pool.URLs()[0], ""},
		{http.MethodPost, "/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/x"}`},
	} {
		rec := remoteAdmin(tp, c.method, c.path, c.body, "198.51.100.7:40000")
		if rec.Code != http.StatusForbidden || errorCode(t, rec.Body.String()) != "admin_loopback_only" {
			t.Errorf("%s %s from a remote address: %d %s, want 403 admin_loopback_only", c.method, c.path, rec.Code, rec.Body.String())
		}
		if strings.Contains(rec.Body.String(), tp.Pool.URLs()[0]) {
			t.Errorf("%s %s: the refusal reveals a worker URL", c.method, c.path)
		}
	}
	if len(tp.Pool.URLs()) != 1 {
		t.Fatalf("the pool changed: %v", tp.Pool.URLs())
	}
}

func TestAdminPlaneTreatsAProxiedLoopbackCallerAsRemote(t *testing.T) {
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "w").URL}})
	for _, h := range []string{"X-Forwarded-For", "Forwarded"} {
		status, _, body := tp.do(t, http.MethodGet, "/workers", h, "for=203.0.113.9")
		if status != http.StatusForbidden {
			t.Errorf("GET /workers over loopback with %s: %d %s, want 403", h, status, body)
		}
		if _, _, body := tp.do(t, http.MethodGet, "/health", h, "for=203.0.113.9"); strings.Contains(body, `"workers"`) {
			t.Errorf("/health over loopback with %s shows the worker list", h)
		}
	}
	if status, _, body := tp.do(t, http.MethodGet, "/workers"); status != http.StatusOK {
		t.Fatalf("GET /workers from loopback: %d %s, want 200", status, body)
	}
}

func TestAdminPlaneWithAKeyServesARemoteCallerThatSendsIt(t *testing.T) {
	opts := testOptions()
	opts.AdminAPIKey = "adm1n-key"
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "w").URL}, opts: &opts})
	req := httptest.NewRequest(http.MethodGet, "/workers", nil)
	req.RemoteAddr = "198.51.100.7:40000"
	req.Header.Set("Authorization", "Bearer adm1n-key")
	rec := httptest.NewRecorder()
	tp.Server.mux.ServeHTTP(rec, req)
	if rec.Code != http.StatusOK {
		t.Fatalf("%d %s, want 200", rec.Code, rec.Body.String())
	}
}

func TestAdminAPIRefusesWorkerURLsWithCredentialsUnlessAllowed(t *testing.T) {
	fleet := &probeRecorder{}
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "w").URL}, fleet: fleet})
	status, _, body := tp.post(t, "/workers", `{"url":"http://user:secret@10.0.0.9:8000"}`)
	if status != http.StatusBadRequest || errorCode(t, body) != "invalid_worker_url" || strings.Contains(body, "secret") {
		t.Fatalf("%d %s, want 400 invalid_worker_url without the password", status, body)
	}
	opts := testOptions()
	opts.AdminURLCredentials = true
	tp = newTestProxy(t, setup{urls: []string{okWorker(t, "w").URL}, fleet: fleet, opts: &opts})
	if status, _, body := tp.post(t, "/workers", `{"url":"http://user:secret@10.0.0.9:8000"}`); status != http.StatusOK {
		t.Fatalf("allowed: %d %s", status, body)
	}
}
