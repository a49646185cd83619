package router

import (
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// A worker that only answered 503 must not become the holder of the conversation it failed:
// before the policy learned only from accepted, successful attempts, such a worker was later
// chosen as the cache_affinity holder of the history the other worker had actually served.
func TestWorkerThatAnswered503DoesNotBecomeTheHistorysHolder(t *testing.T) {
	failing, healthy := newFakeWorker(t), newFakeWorker(t)
	var fail atomic.Bool
	fail.Store(true)
	failing.setHandler(func(rw http.ResponseWriter, r *http.Request) {
		if fail.Load() {
			rw.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"id":"x","object":"chat.completion","choices":[]}`))
	})
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	tr := startRouter(t, cfg, failing, healthy)
	system := strings.Repeat("You are a careful agent with a long shared system prompt. ", 30)
	turn := func(n int) string {
		msgs := `{"role":"system","content":"` + system + `"},{"role":"user","content":"task"}`
		for i := 1; i < n; i++ {
			msgs += `,{"role":"assistant","content":"step ` + string(rune('a'+i)) + `"},{"role":"user","content":"more"}`
		}
		return `{"model":"test-model","messages":[` + msgs + `]}`
	}
	// One request kept in flight on the healthy worker makes the failing one the least loaded: turn 1
	// is tried there first, answered 503, and retried on the healthy worker. The later turns then
	// go to the healthy worker only if the tree names it alone as the history's holder; were the
	// failing worker still a holder, the load would send them there.
	for _, w := range tr.Pool().All() {
		if w.URL() == healthy.URL() {
			defer w.Reserve().Release()
		}
	}
	resp := tr.post(t, "/v1/chat/completions", turn(1))
	if body := readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get("x-vllm-router-worker") != healthy.URL() {
		t.Fatalf("turn 1: %d on %s: %s", resp.StatusCode, resp.Header.Get("x-vllm-router-worker"), body)
	}
	if failing.hits.Load() != 1 {
		t.Fatalf("turn 1 reached the failing worker %d times, want once", failing.hits.Load())
	}
	fail.Store(false) // it would answer now: only the tree can send the next turns there
	for n := 2; n <= 4; n++ {
		resp := tr.post(t, "/v1/chat/completions", turn(n))
		readAll(t, resp)
		if got := resp.Header.Get("x-vllm-router-worker"); got != healthy.URL() {
			t.Fatalf("turn %d went to %s (%s), not to the worker that served the conversation", n, got, resp.Header.Get("x-vllm-router-decision"))
		}
	}
}

func TestRemovingAWorkerGivenWithATrailingSlashForgetsItsState(t *testing.T) {
	a, b := newFakeWorker(t), newFakeWorker(t)
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	tr := startRouter(t, cfg, a, b)
	resp := tr.post(t, "/v1/chat/completions", chatBody, "x-session-id", "s")
	readAll(t, resp)
	holder := resp.Header.Get("x-vllm-router-worker")
	if err := tr.RemoveWorker(holder + "/"); err != nil {
		t.Fatal(err)
	}
	for _, w := range tr.Pool().All() {
		if w.URL() == holder {
			t.Fatal("the worker is still in the pool")
		}
	}
	resp = tr.post(t, "/v1/chat/completions", chatBody, "x-session-id", "s")
	readAll(t, resp)
	if got := resp.Header.Get("x-vllm-router-decision"); got == "session_id_match" {
		t.Fatal("the session still pointed at the removed worker's replacement: state was not cleared")
	}
	metrics := readAll(t, mustGet(t, tr.url+"/metrics"))
	if strings.Contains(metrics, `worker="`+holder+`"`) {
		t.Fatalf("the removed worker's metric series remain:\n%s", grepLines(metrics, holder))
	}
}
