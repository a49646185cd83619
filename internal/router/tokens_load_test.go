package router

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// With --load-signal tokens a long prompt weighs on its worker while the worker prefills it (until
// the first byte of the answer), then counts as one request until the answer ends.
func TestTokensSignalWeighsALongPromptUntilItsFirstByte(t *testing.T) {
	fw := newFakeWorker(t)
	firstByte, finish, ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	t.Cleanup(func() { close(ended) }) // runs before the worker server closes (cleanups run last first): a failed test does not hang
	wait := func(c chan struct{}) {
		select {
		case <-c:
		case <-ended:
		}
	}
	fw.setHandler(func(w http.ResponseWriter, r *http.Request) {
		wait(firstByte)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"))
		w.(http.Flusher).Flush()
		wait(finish)
		_, _ = w.Write([]byte("data: [DONE]\n\n"))
	})
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.LoadSignal = "tokens"
	cfg.LoadUnitTokens = 1024
	tr := startRouter(t, cfg, fw)
	w := tr.Pool().All()[0]

	prompt := strings.Repeat("a long document to prefill ", 1600) // about 43,000 bytes: 10,800 tokens at 4 bytes each
	body, _ := json.Marshal(map[string]any{"model": "test-model", "stream": true,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	done := make(chan string)
	go func() {
		resp := tr.post(t, "/v1/chat/completions", string(body))
		done <- readAll(t, resp)
	}()
	testkit.WaitFor(t, "the request to reach the worker", func() bool { return fw.hits.Load() == 1 })
	if got := w.Load(); got < 1+9 || got > 1+11 {
		t.Fatalf("load while the worker prefills about 10,800 tokens: %d, want 1 + about 10 units of 1,024 tokens", got)
	}
	close(firstByte)
	testkit.WaitFor(t, "the prefill weight to go once the first byte passed", func() bool { return w.Load() == 1 })
	close(finish)
	if out := <-done; !strings.Contains(out, "[DONE]") {
		t.Fatalf("answer %q", out)
	}
	testkit.WaitFor(t, "the load to go", func() bool { return w.Load() == 0 && w.PendingPrefillTokens() == 0 })
}
