package router

import (
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

func TestClientKeysFileClosesTheRouteAndReloadRotatesKeys(t *testing.T) {
	path := clientKeysFile(t, "sk-old tenant=team-a\n")
	cfg := testConfig()
	cfg.ClientAPIKeysFile = path
	tr := startRouter(t, cfg, newFakeWorker(t))
	status := func(key string) int { return tr.chatWithKey(t, key) }
	if got := status("sk-old"); got != http.StatusOK {
		t.Fatalf("listed key: %d, want 200", got)
	}
	if got := status("sk-new"); got != http.StatusUnauthorized {
		t.Fatalf("unlisted key: %d, want 401", got)
	}
	writeClientKeys(t, path, "sk-new tenant=team-a\n")
	if err := tr.ReloadClientKeys(); err != nil {
		t.Fatal(err)
	}
	if status("sk-new") != http.StatusOK || status("sk-old") != http.StatusUnauthorized {
		t.Fatal("after the reload the new key is not accepted or the old one still is")
	}
	writeClientKeys(t, path, "this line is not a key file entry tenant=\n")
	if err := tr.ReloadClientKeys(); err == nil || strings.Contains(err.Error(), "sk-") {
		t.Fatalf("a bad file reloaded without error, or its error shows key material: %v", err)
	}
	if status("sk-new") != http.StatusOK {
		t.Fatal("a failed reload dropped the keys in use")
	}
}

func TestUnreadableClientKeysFileStopsTheStart(t *testing.T) {
	cfg := testConfig()
	cfg.ClientAPIKeysFile = filepath.Join(t.TempDir(), "missing")
	if _, err := New(cfg, nil); err == nil {
		t.Fatal("a router started with a client keys file that does not exist")
	}
}

func TestTenantRateLimitsApplyToEachKeysTenant(t *testing.T) {
	cfg := testConfig()
	cfg.ClientAPIKeysFile = clientKeysFile(t, "sk-a tenant=a\nsk-b tenant=b\n")
	cfg.TenantRPM = 1
	tr := startRouter(t, cfg, newFakeWorker(t))
	status := func(key string) int { return tr.chatWithKey(t, key) }
	if status("sk-a") != http.StatusOK || status("sk-a") != http.StatusTooManyRequests {
		t.Fatal("tenant a: want its one request a minute, then 429")
	}
	if status("sk-b") != http.StatusOK {
		t.Fatal("tenant b was limited by tenant a's use")
	}
}

func TestKeysFileNamingAnUnknownPriorityDoesNotLoad(t *testing.T) {
	cfg := testConfig()
	cfg.ClientAPIKeysFile = clientKeysFile(t, "sk-a tenant=a priority=urgent\n")
	cfg.MaxConcurrentRequests = 4
	cfg.PriorityLevels = []string{"interactive", "default", "batch"}
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "urgent") {
		t.Fatalf("got %v, want the unknown level named", err)
	}
}

func TestWorkerURLAllowKeepsTheRouterFromConnectingElsewhere(t *testing.T) {
	outside := newFakeWorker(t) // on 127.0.0.1, outside the allowed prefix
	cfg := testConfig()
	cfg.WorkerURLAllow = []string{"10.0.0.0/8"}
	tr := startRouter(t, cfg)
	// An address outside the list is refused when it is added.
	resp := tr.post(t, "/workers", `{"url":"`+outside.URL()+`"}`)
	if body := readAll(t, resp); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "worker_not_allowed") {
		t.Fatalf("adding %s: %d %s, want 403 worker_not_allowed", outside.URL(), resp.StatusCode, body)
	}
	// A name that resolves outside it is registered, but never connected to.
	byName := strings.Replace(outside.URL(), "127.0.0.1", "localhost", 1)
	if err := tr.AddWorker(t.Context(), byName); err != nil {
		t.Fatal(err)
	}
	resp = tr.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`)
	readAll(t, resp)
	if resp.StatusCode < 500 {
		t.Fatalf("a request was answered %d through a worker outside the list", resp.StatusCode)
	}
	if n := outside.hits.Load(); n != 0 {
		t.Fatalf("the worker outside the list got %d routed requests", n)
	}
	if ws := tr.Pool().Get(byName); len(ws) != 1 || ws[0].Healthy() {
		t.Fatal("the worker outside the list passed a health probe: the router connected to it")
	}
}
