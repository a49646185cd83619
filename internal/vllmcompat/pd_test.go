package vllmcompat

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// The vLLM router's prefill/decode tests, with its command lines: --prefill URL none or
// --prefill URL PORT, --decode URL, and the data-parallel sizes of each side.

// longPrompt is a prompt worth a transfer: cacheroute lets a decode worker compute a prompt
// shorter than --pd-min-uncached-tokens (256) itself, where the vLLM router prefills every
// prompt on a prefill worker; the vLLM router's own test sends "hello", which cacheroute decodes
// without a prefill leg.
var longPrompt = strings.Repeat("hello there, ", 120)

// The prefill side runs at DP 4 and the decode side at DP 2: each request's prefill leg goes to a
// rank of the prefill worker with one token to generate, its decode leg to a rank of the decode
// worker with the client's max_tokens and the prefill's kv_transfer_params; over eight requests
// every rank of each side takes some.
func TestPDAsymmetricSizesThroughThePythonLaunchersCommandLine(t *testing.T) {
	prefill := newMockWorker(t, mockOptions{})
	decode := newMockWorker(t, mockOptions{})
	r := startRouter(t, routerArgs{pd: true, prefill: []prefillWorker{{url: prefill.URL}}, decode: []string{decode.URL},
		extra: []extra{{"prefill_data_parallel_size", 4}, {"decode_data_parallel_size", 2}}})
	for range 8 {
		a := post(r.url+"/v1/completions", map[string]any{"model": "mock", "prompt": longPrompt, "max_tokens": 7})
		if a.status != 200 {
			t.Fatalf("status %d %v", a.status, a.body)
		}
		if a.workerID() != decode.id || a.header.Get("x-vllm-router-pd") != "transfer" {
			t.Fatalf("answered by %s, P/D path %q; want the decode worker, after a transfer", a.workerID(), a.header.Get("x-vllm-router-pd"))
		}
	}
	for _, side := range []struct {
		w         *mockWorker
		ranks     int
		maxTokens float64
	}{{prefill, 4, 1}, {decode, 2, 7}} {
		got := side.w.requests()
		if len(got) != 8 {
			t.Fatalf("worker %s got %d requests, want 8", side.w.id, len(got))
		}
		var ranks []int
		for _, c := range got {
			rank, err := strconv.Atoi(c.Headers.Get("X-Data-Parallel-Rank"))
			if err != nil {
				t.Fatalf("a request without its rank: %v", c.Headers)
			}
			if !slices.Contains(ranks, rank) {
				ranks = append(ranks, rank)
			}
			if c.Body["max_tokens"] != side.maxTokens {
				t.Errorf("worker %s got max_tokens %v, want %v", side.w.id, c.Body["max_tokens"], side.maxTokens)
			}
		}
		slices.Sort(ranks)
		if want := []int{0, 1, 2, 3}[:side.ranks]; !slices.Equal(ranks, want) {
			t.Errorf("worker %s took ranks %v, want %v", side.w.id, ranks, want)
		}
	}
	for _, c := range decode.requests() {
		if params, _ := c.Body["kv_transfer_params"].(map[string]any); params["remote_engine_id"] != prefill.id {
			t.Fatalf("a decode leg without the prefill's kv_transfer_params: %v", c.Body)
		}
	}
}

// power_of_two places the decode side: every answer comes from a decode worker, and more than one
// takes requests. The prefill workers are given with bootstrap ports, which the NIXL transfer
// does not use: one warning each says so.
func TestPDPowerOfTwoDecodeAttribution(t *testing.T) {
	_, prefillURLs, _ := mockWorkers(t, 2, mockOptions{})
	_, decodeURLs, decodeIDs := mockWorkers(t, 3, mockOptions{})
	r := startRouter(t, routerArgs{policy: "power_of_two", pd: true,
		prefill: []prefillWorker{{prefillURLs[0], "8998"}, {prefillURLs[1], "8999"}}, decode: decodeURLs,
		extra: []extra{{"worker_startup_check_interval", 1}}})
	counts := map[string]int{}
	for i := range 30 {
		a := post(r.url+"/v1/completions", completion(fmt.Sprintf("p%d", i), 1))
		if a.status != 200 || !slices.Contains(decodeIDs, a.workerID()) {
			t.Fatalf("status %d from %q, want 200 from a decode worker", a.status, a.workerID())
		}
		counts[a.workerID()]++
	}
	if len(counts) < 2 {
		t.Fatalf("decode workers used: %v, want at least two", counts)
	}
	for _, port := range []string{"8998", "8999"} {
		if got := r.logs.Lines("level=WARN", "flag=--prefill", port); len(got) != 1 {
			t.Errorf("warnings about the bootstrap port %s: %q, want one", port, got)
		}
	}
}

// With one decode worker slowed down and loaded from elsewhere, power_of_two sends most requests
// to the other one.
func TestPDPowerOfTwoSkewsToFasterDecode(t *testing.T) {
	_, prefillURLs, _ := mockWorkers(t, 2, mockOptions{})
	slow := newMockWorker(t, mockOptions{latency: 300 * time.Millisecond})
	fast := newMockWorker(t, mockOptions{})
	r := startRouter(t, routerArgs{policy: "power_of_two", pd: true,
		prefill: []prefillWorker{{url: prefillURLs[0]}, {url: prefillURLs[1]}}, decode: []string{slow.URL, fast.URL},
		extra: []extra{{"worker_startup_check_interval", 1}}})
	concurrently(32, 16, func(i int) answer { return post(r.url+"/v1/completions", completion(fmt.Sprintf("warm-%d", i), 1)) })
	ids := underDirectLoad(t, slow, 4, func() []string { return workerIDs(t, r, 100) })
	counts := tally(ids)
	if counts[fast.id] < counts[slow.id]*6/5 || counts[fast.id] <= counts[slow.id] {
		t.Fatalf("fast decode worker %d, slow %d of 100: want at least 20 %% more on the fast one", counts[fast.id], counts[slow.id])
	}
}
