package routerapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// The admin plane without an admin key: open to callers on this host's loopback only.

func TestAdminPlaneRefusesARemoteCallerAddingAWorkerWithoutAKey(t *testing.T) {
	w := testkit.NamedServer(t, http.StatusOK, "w")
	ta := newTestAPI(t, Options{Fleet: &probeRecorder{}}, w.URL)
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/workers", `{"url":"http://attacker.example:8000"}`},
		{http.MethodPost, "/add_worker?url=http://attacker.example:8000", ""},
		{http.MethodGet, "/workers", ""},
		{http.MethodGet, "/list_workers", ""},
		{http.MethodPost, "/remove_worker?url=" + ta.Pool.URLs()[0], ""},
		{http.MethodPost, "/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/x"}`},
	} {
		rec := ta.remote(c.method, c.path, c.body, "198.51.100.7:40000")
		if rec.Code != http.StatusForbidden || errorCode(t, rec.Body.String()) != "admin_loopback_only" {
			t.Errorf("%s %s from a remote address: %d %s, want 403 admin_loopback_only", c.method, c.path, rec.Code, rec.Body.String())
		}
		if strings.Contains(rec.Body.String(), ta.Pool.URLs()[0]) {
			t.Errorf("%s %s: the refusal reveals a worker URL", c.method, c.path)
		}
	}
	if len(ta.Pool.URLs()) != 1 {
		t.Fatalf("the pool changed: %v", ta.Pool.URLs())
	}
}

func TestAdminPlaneTreatsAProxiedLoopbackCallerAsRemote(t *testing.T) {
	ta := newTestAPI(t, Options{}, testkit.NamedServer(t, http.StatusOK, "w").URL)
	for _, h := range []string{"X-Forwarded-For", "Forwarded"} {
		status, _, body := ta.do(t, http.MethodGet, "/workers", "", h, "for=203.0.113.9")
		if status != http.StatusForbidden {
			t.Errorf("GET /workers over loopback with %s: %d %s, want 403", h, status, body)
		}
		if _, _, body := ta.do(t, http.MethodGet, "/health", "", h, "for=203.0.113.9"); strings.Contains(body, `"workers"`) {
			t.Errorf("/health over loopback with %s shows the worker list", h)
		}
	}
	if status, _, body := ta.do(t, http.MethodGet, "/workers", ""); status != http.StatusOK {
		t.Fatalf("GET /workers from loopback: %d %s, want 200", status, body)
	}
}

func TestAdminPlaneWithAKeyServesARemoteCallerThatSendsIt(t *testing.T) {
	ta := newTestAPI(t, Options{AdminAPIKey: "adm1n-key"}, testkit.NamedServer(t, http.StatusOK, "w").URL)
	if rec := ta.remote(http.MethodGet, "/workers", "", "198.51.100.7:40000", "Authorization", "Bearer adm1n-key"); rec.Code != http.StatusOK {
		t.Fatalf("%d %s, want 200", rec.Code, rec.Body.String())
	}
}

func TestAdminAPIRefusesWorkerURLsWithCredentialsUnlessAllowed(t *testing.T) {
	w := testkit.NamedServer(t, http.StatusOK, "w")
	ta := newTestAPI(t, Options{Fleet: &probeRecorder{}}, w.URL)
	status, _, body := ta.do(t, http.MethodPost, "/workers", `{"url":"http://user:secret@10.0.0.9:8000"}`)
	if status != http.StatusBadRequest || errorCode(t, body) != "invalid_worker_url" || strings.Contains(body, "secret") {
		t.Fatalf("%d %s, want 400 invalid_worker_url without the password", status, body)
	}
	ta = newTestAPI(t, Options{Fleet: &probeRecorder{}, AdminURLCredentials: true}, w.URL)
	if status, _, body := ta.do(t, http.MethodPost, "/workers", `{"url":"http://user:secret@10.0.0.9:8000"}`); status != http.StatusOK {
		t.Fatalf("allowed: %d %s", status, body)
	}
}

func TestAdminBearerSchemeIsCaseInsensitive(t *testing.T) {
	ta := newTestAPI(t, Options{AdminAPIKey: "adm1n-key"}, testkit.NamedServer(t, http.StatusOK, "w").URL)
	for auth, want := range map[string]int{
		"Bearer adm1n-key": http.StatusOK,
		"bearer adm1n-key": http.StatusOK,
		"BEARER adm1n-key": http.StatusOK,
		"bEaReR adm1n-key": http.StatusOK,
		"Bearer wrong-key": http.StatusUnauthorized,
		"Bearer adm1n":     http.StatusUnauthorized,
		"Basic adm1n-key":  http.StatusUnauthorized,
		"adm1n-key":        http.StatusUnauthorized,
		"":                 http.StatusUnauthorized,
	} {
		status, _, body := ta.do(t, http.MethodGet, "/list_workers", "", "Authorization", auth)
		if status != want {
			t.Errorf("Authorization %q: %d %q, want %d", auth, status, body, want)
		}
	}
}

func TestHealthShowsWorkerURLsOnlyToLoopbackOrAdmin(t *testing.T) {
	w := testkit.NamedServer(t, http.StatusOK, "w")
	hostPort := strings.TrimPrefix(w.URL, "http://")

	health := func(t *testing.T, ta *testAPI, header ...string) map[string]json.RawMessage {
		t.Helper()
		status, _, body := ta.do(t, http.MethodGet, "/health", "", header...)
		if status != http.StatusOK {
			t.Fatalf("/health: %d %q", status, body)
		}
		var m map[string]json.RawMessage
		if err := json.Unmarshal([]byte(body), &m); err != nil {
			t.Fatalf("/health body %q: %v", body, err)
		}
		if _, ok := m["worker_counts"]; !ok {
			t.Errorf("/health has no worker_counts: %q", body)
		}
		return m
	}

	t.Run("no admin key, loopback caller", func(t *testing.T) {
		m := health(t, newTestAPI(t, Options{}, w.URL))
		if !strings.Contains(string(m["workers"]), hostPort) {
			t.Errorf("workers %s, want the worker's URL", m["workers"])
		}
	})
	t.Run("admin key set, caller without it", func(t *testing.T) {
		ta := newTestAPI(t, Options{AdminAPIKey: "adm1n-key"}, w.URL)
		status, _, body := ta.do(t, http.MethodGet, "/health", "")
		if status != http.StatusOK {
			t.Fatalf("/health: %d", status)
		}
		if strings.Contains(body, hostPort) || strings.Contains(body, `"workers"`) {
			t.Errorf("/health without the admin key shows the topology: %q", body)
		}
		health(t, ta) // counts are still there
		for _, auth := range []string{"Bearer wrong", "adm1n-key", "Basic adm1n-key"} {
			if m := health(t, ta, "Authorization", auth); m["workers"] != nil {
				t.Errorf("Authorization %q: /health shows workers", auth)
			}
		}
	})
	t.Run("admin key set, caller with it", func(t *testing.T) {
		m := health(t, newTestAPI(t, Options{AdminAPIKey: "adm1n-key"}, w.URL), "Authorization", "Bearer adm1n-key")
		if !strings.Contains(string(m["workers"]), hostPort) {
			t.Errorf("workers %s, want the worker's URL", m["workers"])
		}
	})
}
