package router

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

func TestAccessLogFileGetsALinePerRoutedRequest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	cfg := testConfig()
	cfg.AccessLog = path
	tr := startRouter(t, cfg, newFakeWorker(t))
	readAll(t, tr.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, "x-request-id", "logged-1"))
	testkit.WaitFor(t, "the access log line", func() bool {
		b, _ := os.ReadFile(path)
		return strings.Contains(string(b), `"request_id":"logged-1"`)
	})
}

func TestAccessLogThatCannotBeOpenedStopsTheStart(t *testing.T) {
	cfg := testConfig()
	cfg.AccessLog = filepath.Join(t.TempDir(), "missing-dir", "access.log")
	if _, err := New(cfg, nil); err == nil || !strings.Contains(err.Error(), "--access-log") {
		t.Fatalf("got %v, want an error naming --access-log", err)
	}
}

func TestAccessLogSessionHashIsKeyedByTheConfiguredSalt(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	cfg := testConfig()
	cfg.AccessLog = path
	cfg.SessionHashSalt = "shared-by-the-replicas"
	tr := startRouter(t, cfg, newFakeWorker(t))
	readAll(t, tr.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, "x-session-id", "1234"))
	mac := hmac.New(sha256.New, []byte(cfg.SessionHashSalt))
	mac.Write([]byte("session:1234"))
	want := `"session":"` + hex.EncodeToString(mac.Sum(nil)[:6]) + `"`
	testkit.WaitFor(t, "the access log line with the salted hash", func() bool {
		b, _ := os.ReadFile(path)
		return strings.Contains(string(b), want)
	})
}
