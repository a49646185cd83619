package router

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestAccessLogFileGetsALinePerRoutedRequest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	cfg := testConfig()
	cfg.AccessLog = path
	tr := startRouter(t, cfg, newFakeWorker(t))
	readAll(t, tr.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}]}`, "x-request-id", "logged-1"))
	waitFor(t, "the access log line", func() bool {
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
