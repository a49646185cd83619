package router

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/sim"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// sharedPrompt is a system prompt and tools of about 30,000 simulated tokens that every session
// of an agent sends first.
func sharedPrompt() string {
	var b strings.Builder
	for i := 0; b.Len() < 100_000; i++ {
		fmt.Fprintf(&b, "tool_%d takes a path and a pattern and returns the lines that match them. ", i)
	}
	return b.String()
}

// Eight agent sessions that share a 30k-token system prompt start at once on four idle workers
// whose engines report their KV capacity: the prefix is worth one prefill on each worker, so the
// sessions spread (no worker takes more than 3, however their Selects interleave), and each stays
// on its worker, its cached tokens growing every turn.
func TestSessionsSharingALongPrefixSpreadAndStay(t *testing.T) {
	simCfg := instantSim()
	fleet := startSimFleetOf(t, 4, simCfg)
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.WorkerURLs = fleet.URLs()
	tr := startRouter(t, cfg)
	tr.Start(t.Context()) // the workers, probed, and the scrapes of their /metrics
	testkit.WaitFor(t, "every worker's KV capacity", func() bool {
		for _, w := range tr.pool.All() {
			if w.KVCapacity() == 0 {
				return false
			}
		}
		return true
	})
	system := sharedPrompt()
	type msg struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	homes := make([]string, 8)
	histories := make([][]msg, 8)
	prevCached := make([]int, 8)
	for s := range 8 {
		histories[s] = []msg{{"system", system}, {"user", fmt.Sprintf("Session %d: fix issue %d.", s, 100+s)}}
		prevCached[s] = -1
	}
	// The eight sessions send each turn at once, and the next turn once every session has its
	// answer: a turn that arrived while another session's first prefill was still queued on its
	// worker could rightly move to a worker that computes it sooner (session_moved).
	for turn := 1; turn <= 4; turn++ {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for s := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				body, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": histories[s], "max_tokens": 16})
				resp := tr.post(t, "/v1/chat/completions", string(body), "x-session-id", fmt.Sprintf("agent-%d", s))
				raw := readAll(t, resp)
				var reply chatReply
				if resp.StatusCode != 200 || json.Unmarshal([]byte(raw), &reply) != nil || len(reply.Choices) == 0 {
					errs <- fmt.Errorf("session %d turn %d: %d %s", s, turn, resp.StatusCode, raw)
					return
				}
				worker, decision := resp.Header.Get(proxy.HeaderWorker), resp.Header.Get(proxy.HeaderDecision)
				cached := reply.Usage.PromptTokensDetails.CachedTokens
				switch {
				case turn == 1:
					homes[s] = worker
				case worker != homes[s] || decision != "session_id_match":
					errs <- fmt.Errorf("session %d turn %d: %s on %s, want session_id_match on %s", s, turn, decision, worker, homes[s])
					return
				case cached <= prevCached[s]:
					errs <- fmt.Errorf("session %d turn %d: %d cached tokens, %d the turn before: want more every turn", s, turn, cached, prevCached[s])
					return
				}
				prevCached[s] = cached
				histories[s] = append(histories[s], msg{"assistant", reply.Choices[0].Message.Content},
					msg{"user", fmt.Sprintf("Turn %d: the tests printed %d lines.", turn, turn*11)})
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	per := map[string]int{}
	for _, h := range homes {
		per[h]++
	}
	for w, n := range per {
		if n > 3 {
			t.Errorf("%s holds %d of the 8 sessions (%v), want at most 3", w, n, per)
		}
	}
}

// admissionRouter is a cache_aware router in front of the given simulated workers, its session
// admission waiting at most timeout, with the workers' KV capacities read before it returns.
// configure, if not nil, changes the rest of its configuration.
func admissionRouter(t *testing.T, urls []string, timeout float64, configure func(*config.Config)) *testRouter {
	t.Helper()
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.WorkerURLs = urls
	cacheaware.KnobsIn(cfg.PolicyOptions).SessionAdmissionTimeoutSecs = timeout
	if configure != nil {
		configure(&cfg)
	}
	tr := startRouter(t, cfg)
	tr.Start(t.Context())
	testkit.WaitFor(t, "the workers' KV capacities", func() bool {
		for _, w := range tr.pool.All() {
			if w.KVCapacity() == 0 {
				return false
			}
		}
		return true
	})
	return tr
}

// smallKVSims starts n simulated workers whose KV cache holds 2,048 blocks (32,768 tokens).
func smallKVSims(t *testing.T, n int) *sim.Fleet {
	t.Helper()
	cfg := instantSim()
	cfg.KVCacheBlocks = 2048
	f := startSimFleetOf(t, n, cfg)
	return f
}

// bigTurn is a first turn of session id with a prompt of about 17,500 simulated tokens, its own:
// two do not fit the room of one smallKVSims worker.
func bigTurn(id string) string {
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4, "messages": []map[string]string{
		{"role": "user", "content": strings.Repeat(id+" reads the whole repository again. ", 2500)}}})
	return string(body)
}

// A second session whose working set no worker has room for, with the first one live, waits in
// the router for its --session-admission-timeout-secs, then is placed anyway: kv_room_exhausted,
// one wait counted as timed out, nobody left waiting. The wait is not the worker's: its first-byte
// timeout, shorter than the wait, runs from the attempt.
func TestASessionWithoutRoomWaitsItsTimeoutThenIsPlaced(t *testing.T) {
	tr := admissionRouter(t, smallKVSims(t, 1).URLs(), 0.5, func(c *config.Config) { c.FirstByteTimeoutSecs = 0.25 })
	if resp := tr.post(t, "/v1/chat/completions", bigTurn("a"), "x-session-id", "a"); readAll(t, resp) == "" || resp.StatusCode != 200 {
		t.Fatalf("first session: %d", resp.StatusCode)
	}
	resp := tr.post(t, "/v1/chat/completions", bigTurn("b"), "x-session-id", "b")
	if readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get(proxy.HeaderDecision) != cacheaware.LabelKVRoomExhausted {
		t.Fatalf("second session: %d %s, want 200 %s", resp.StatusCode, resp.Header.Get(proxy.HeaderDecision), cacheaware.LabelKVRoomExhausted)
	}
	if v, _ := metricValue(t, tr, `vllm_router_session_admission_waits_total{outcome="timeout"}`); v != 1 {
		t.Fatalf("waits timed out: %v, want 1", v)
	}
	if v, _ := metricValue(t, tr, "vllm_router_session_admission_waiting"); v != 0 {
		t.Fatalf("%v still waiting", v)
	}
}

// A session waiting for room is placed as soon as a worker with room joins the fleet.
func TestAWaitingSessionIsPlacedWhenAWorkerWithRoomJoins(t *testing.T) {
	fleet := smallKVSims(t, 2)
	tr := admissionRouter(t, fleet.URLs()[:1], 60, nil)
	if resp := tr.post(t, "/v1/chat/completions", bigTurn("a"), "x-session-id", "a"); readAll(t, resp) == "" || resp.StatusCode != 200 {
		t.Fatalf("first session: %d", resp.StatusCode)
	}
	second := make(chan *http.Response, 1)
	go func() { second <- tr.post(t, "/v1/chat/completions", bigTurn("b"), "x-session-id", "b") }()
	testkit.WaitFor(t, "the second session to wait", func() bool {
		v, _ := metricValue(t, tr, "vllm_router_session_admission_waiting")
		return v == 1
	})
	if err := tr.AddWorker(t.Context(), fleet.URLs()[1]); err != nil {
		t.Fatal(err)
	}
	resp := <-second
	if readAll(t, resp); resp.StatusCode != 200 || resp.Header.Get(proxy.HeaderDecision) != cacheaware.LabelKVRoomWaited ||
		resp.Header.Get(proxy.HeaderWorker) != fleet.URLs()[1] {
		t.Fatalf("second session: %d %s on %s, want %s on the new worker", resp.StatusCode, resp.Header.Get(proxy.HeaderDecision),
			resp.Header.Get(proxy.HeaderWorker), cacheaware.LabelKVRoomWaited)
	}
}

// A client that leaves while its session waits for room leaves the queue at once.
func TestAClientThatLeavesWhileWaitingForRoomLeavesTheQueue(t *testing.T) {
	tr := admissionRouter(t, smallKVSims(t, 1).URLs(), 60, nil)
	if resp := tr.post(t, "/v1/chat/completions", bigTurn("a"), "x-session-id", "a"); readAll(t, resp) == "" || resp.StatusCode != 200 {
		t.Fatalf("first session: %d", resp.StatusCode)
	}
	ctx, cancel := context.WithCancel(t.Context())
	req, _ := http.NewRequestWithContext(ctx, "POST", tr.url+"/v1/chat/completions", strings.NewReader(bigTurn("b")))
	req.Header.Set("content-type", "application/json")
	req.Header.Set("x-session-id", "b")
	done := make(chan struct{})
	go func() {
		defer close(done)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	testkit.WaitFor(t, "the second session to wait", func() bool {
		v, _ := metricValue(t, tr, "vllm_router_session_admission_waiting")
		return v == 1
	})
	cancel()
	<-done
	testkit.WaitFor(t, "the wait to end as the client left", func() bool {
		v, _ := metricValue(t, tr, `vllm_router_session_admission_waits_total{outcome="client_gone"}`)
		w, _ := metricValue(t, tr, "vllm_router_session_admission_waiting")
		return v == 1 && w == 0
	})
}
