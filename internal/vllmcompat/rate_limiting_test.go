package vllmcompat

import (
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// The vLLM router's rate-limiting tests: --max-concurrent-requests with --queue-size and
// --queue-timeout-secs. A request the queue cannot take gets 429 with Retry-After; one that
// waited out the queue timeout gets 408.

func TestRateLimitAndQueue(t *testing.T) {
	_, urls, _ := mockWorkers(t, 1, mockOptions{latency: 100 * time.Millisecond})
	r := startRouter(t, routerArgs{workerURLs: urls, policy: "round_robin", extra: []extra{
		{"max_concurrent_requests", 2}, {"queue_size", 0}, // no queue: 429 at once over the limit
	}})
	statuses := concurrently(16, 16, func(i int) int { return post(r.url+"/v1/completions", completion(fmt.Sprintf("p%d", i), 1)).status })
	if !slices.Contains(statuses, 200) || !slices.Contains(statuses, 429) {
		t.Fatalf("statuses %v, want some 200 and some 429", statuses)
	}
}

// One request runs (the worker holds it), one waits in the queue of one and times out after a
// second (408), the other two find the queue full (429); the running one then ends 200.
func TestRateLimitQueueAndTimeout(t *testing.T) {
	hold := make(chan struct{})
	w := newMockWorker(t, mockOptions{hold: hold})
	r := startRouter(t, routerArgs{workerURLs: []string{w.URL}, policy: "round_robin", extra: []extra{
		{"max_concurrent_requests", 1}, {"queue_size", 1}, {"queue_timeout_secs", 1},
	}})
	first := make(chan int, 1)
	go func() { first <- post(r.url+"/v1/completions", completion("q0", 1)).status }()
	testkit.WaitFor(t, "the first request at the worker", func() bool { return w.inFlight.Load() == 1 })
	rest := concurrently(3, 3, func(i int) answer { return post(r.url+"/v1/completions", completion(fmt.Sprintf("q%d", i+1), 1)) })
	close(hold)
	statuses := []int{<-first}
	for _, a := range rest {
		statuses = append(statuses, a.status)
		if a.status == 408 || a.status == 429 {
			if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 {
				t.Errorf("%d with Retry-After %q, want at least 1", a.status, a.header.Get("Retry-After"))
			}
		}
	}
	slices.Sort(statuses)
	if want := []int{200, 408, 429, 429}; !slices.Equal(statuses, want) {
		t.Fatalf("statuses %v, want %v: one run, one timed out in the queue, two over a full queue", statuses, want)
	}
}

func TestRateLimit429CarriesRetryAfter(t *testing.T) {
	_, urls, _ := mockWorkers(t, 1, mockOptions{latency: 100 * time.Millisecond})
	r := startRouter(t, routerArgs{workerURLs: urls, policy: "round_robin", extra: []extra{
		{"max_concurrent_requests", 1}, {"queue_size", 0},
	}})
	answers := concurrently(8, 8, func(i int) answer { return post(r.url+"/v1/completions", completion(fmt.Sprintf("r%d", i), 1)) })
	throttled := 0
	for _, a := range answers {
		if a.status != 429 {
			continue
		}
		throttled++
		if s, err := strconv.Atoi(a.header.Get("Retry-After")); err != nil || s < 1 {
			t.Errorf("429 with Retry-After %q, want at least 1", a.header.Get("Retry-After"))
		}
	}
	if throttled == 0 {
		t.Fatal("no request was throttled")
	}
}
