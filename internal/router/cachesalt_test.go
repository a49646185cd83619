package router

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// vLLM folds a request's cache_salt into its first KV block, so a salted request is never served
// from blocks computed without that salt. A simulated worker (which salts nothing) publishes the
// blocks of an unsalted prompt; the same prompt with a cache_salt is not credited with them,
// while the unsalted prompt again is. Two workers: the events place a request among several.
func TestASaltedRequestIsNotCreditedWithUnsaltedBlocks(t *testing.T) {
	tr := startEventRouter(t, testConfig(), eventWorkers(t, 2))

	prompt := strings.Repeat("the schema of the orders table, its keys and its indexes. ", 200)
	send := func(salt string) string {
		t.Helper()
		req := map[string]any{"model": "sim-model", "max_tokens": 1,
			"messages": []map[string]string{{"role": "user", "content": prompt}}}
		if salt != "" {
			req["cache_salt"] = salt
		}
		body, _ := json.Marshal(req)
		resp := tr.post(t, "/v1/chat/completions", string(body))
		if raw := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("salt %q: %d %s", salt, resp.StatusCode, raw)
		}
		return resp.Header.Get("x-vllm-router-decision")
	}
	send("")
	testkit.WaitFor(t, "the prompt's blocks in the index", func() bool {
		held := 0
		for _, st := range tr.kvEvents.Status() {
			held += st.Blocks
		}
		return held >= 150
	})
	if decision := send("tenant-a"); decision == "kv_events_match" {
		t.Fatalf("a salted request: %s, want no credit for the unsalted blocks", decision)
	}
	if decision := send(""); decision != "kv_events_match" {
		t.Fatalf("the unsalted prompt again: %s, want kv_events_match", decision)
	}
}
