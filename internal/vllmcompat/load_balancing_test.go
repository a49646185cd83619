package vllmcompat

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// The vLLM router's load-balancing tests: cache_aware keeps a repeated prompt, and a chat whose
// system prompt and tools stay, on one worker, and spreads unrelated prompts; power_of_two sends
// fewer requests to the busier worker. Every request names "test-model", which no worker lists.

// tally counts the answers of each worker.
func tally(ids []string) map[string]int {
	counts := map[string]int{}
	for _, id := range ids {
		counts[id]++
	}
	return counts
}

// maxCount is the largest count of counts.
func maxCount(counts map[string]int) int {
	top := 0
	for _, n := range counts {
		top = max(top, n)
	}
	return top
}

// answeredBy posts n bodies, body(i) for the i-th, to url one after another, failing unless each
// is answered 200, and returns how many each worker answered.
func answeredBy(t *testing.T, n int, url string, body func(i int) any) map[string]int {
	t.Helper()
	counts := map[string]int{}
	for i := range n {
		a := post(url, body(i))
		if a.status != 200 {
			t.Fatalf("status %d %v", a.status, a.body)
		}
		counts[a.workerID()]++
	}
	return counts
}

func TestCacheAwareAffinity(t *testing.T) {
	_, urls, _ := mockWorkers(t, 2, mockOptions{})
	r := startRouter(t, routerArgs{workerURLs: urls, policy: "cache_aware"})
	counts := answeredBy(t, 12, r.url+"/v1/completions", func(int) any { return completion("repeated prompt for cache", 1) })
	if maxCount(counts) < 10 {
		t.Fatalf("the repeated prompt went to %v, want 10 of 12 on one worker", counts)
	}
}

// Chats that share their system prompt, developer message and tools, each with its own task,
// stay on the worker that holds that prefix while the workers are equally loaded. The test
// departs from the vLLM router's by one flag: cacheroute's default load is the engines' own
// figures plus the requests sent since their last scrape (--load-signal engine), under which a
// worker that just answered two requests counts as busier for up to a scrape interval, and such
// a short shared prefix (about 25 tokens) is not worth that load (the cost mode). With the vLLM
// router's load, this router's requests in flight, the prefix holder keeps them.
func TestCacheAwareChatAffinityUsesStableAgentPrefix(t *testing.T) {
	_, urls, _ := mockWorkers(t, 2, mockOptions{})
	r := startRouter(t, routerArgs{workerURLs: urls, policy: "cache_aware", own: []string{"--load-signal", "requests"}})
	tools := []map[string]any{{"type": "function", "function": map[string]any{
		"name": "read_file", "description": "Read a file",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"path": map[string]any{"type": "string"}}},
	}}}
	counts := answeredBy(t, 12, r.url+"/v1/chat/completions", func(i int) any {
		return map[string]any{
			"model": "test-model",
			"messages": []map[string]string{
				{"role": "system", "content": "You are a coding agent."},
				{"role": "developer", "content": "Inspect before editing."},
				{"role": "user", "content": fmt.Sprintf("Fix changing task suffix %d", i)},
			},
			"tools": tools, "max_tokens": 1, "stream": false,
		}
	})
	if maxCount(counts) < 10 {
		t.Fatalf("the agent's turns went to %v, want 10 of 12 on one worker", counts)
	}
}

func TestCacheAwareDiversePromptsBalances(t *testing.T) {
	_, urls, _ := mockWorkers(t, 3, mockOptions{latency: 30 * time.Millisecond})
	r := startRouter(t, routerArgs{workerURLs: urls, policy: "cache_aware", extra: []extra{
		{"cache_threshold", 0.99}, {"balance_abs_threshold", 0}, {"balance_rel_threshold", 1.0},
	}})
	ids := concurrently(40, 16, func(int) string {
		a := post(r.url+"/v1/completions", completion(fmt.Sprintf("%016x%016x", rand.Uint64(), rand.Uint64()), 1))
		if a.status != 200 {
			t.Errorf("status %d %v", a.status, a.body)
		}
		return a.workerID()
	})
	counts := tally(ids)
	if len(counts) < 2 {
		t.Fatalf("unrelated prompts went to %v, want at least two workers", counts)
	}
}

// The slow worker holds more requests at once, the router's and those sent to it directly: the
// workers report them on /metrics, and power_of_two, balancing on them, sends it fewer.
func TestPowerOfTwoPrefersLessLoaded(t *testing.T) {
	slow, slowURLs, slowIDs := mockWorkers(t, 1, mockOptions{latency: 200 * time.Millisecond})
	_, fastURLs, fastIDs := mockWorkers(t, 1, mockOptions{})
	r := startRouter(t, routerArgs{workerURLs: append(slowURLs, fastURLs...), policy: "power_of_two",
		extra: []extra{{"worker_startup_check_interval", 1}}})
	concurrently(64, 16, func(i int) answer { return post(r.url+"/v1/completions", completion(fmt.Sprintf("warm-%d", i), 1)) })
	ids := underDirectLoad(t, slow[0], 8, func() []string { return workerIDs(t, r, 100) })
	counts := tally(ids)
	if counts[slowIDs[0]] >= counts[fastIDs[0]] {
		t.Fatalf("slow worker %d, fast worker %d of 100: want fewer on the slow one", counts[slowIDs[0]], counts[fastIDs[0]])
	}
	// The flag the fixture passes is the vLLM router's, with no effect here: one warning says so.
	if got := r.logs.Lines("level=WARN", "--worker-startup-check-interval"); len(got) != 1 {
		t.Errorf("warnings about --worker-startup-check-interval: %q, want one", got)
	}
}

// underDirectLoad runs measure while n clients keep sending requests to w itself, past the router,
// as the vLLM router's tests load a worker from elsewhere; it returns measure's result once the
// clients have stopped.
func underDirectLoad[T any](t *testing.T, w *mockWorker, n int, measure func() T) T {
	t.Helper()
	stop := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		concurrently(n, n, func(i int) int {
			for k := 0; ; k++ {
				select {
				case <-stop:
					return k
				default:
				}
				post(w.URL+"/v1/completions", completion(fmt.Sprintf("bg-%d-%d", i, k), 1))
			}
		})
	}()
	defer func() {
		close(stop)
		<-stopped
	}()
	testkit.WaitFor(t, "the direct load on "+w.id, func() bool { return w.inFlight.Load() >= int64(n)/2 })
	return measure()
}

// workerIDs sends n completions through the router, 16 at a time, and returns who answered each.
func workerIDs(t *testing.T, r *router, n int) []string {
	return concurrently(n, 16, func(i int) string {
		a := post(r.url+"/v1/completions", completion(fmt.Sprintf("p%d", i), 1))
		if a.status != 200 {
			t.Errorf("status %d %v", a.status, a.body)
		}
		return a.workerID()
	})
}
