package router

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/sim"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// Two simulated workers, each serving one base model and its LoRA adapters lora-a and lora-b,
// each publishing its KV-cache events over ZMQ to the router. A long prompt for lora-a lands on
// a worker W, whose engine publishes its blocks under lora-a. The same prompt for lora-a again
// follows them to W (kv_events_match); the same prompt for lora-b, and for the base model, is
// matched against no worker's blocks, and no worker serves any of it from its cache: an
// adapter's blocks serve its own requests only.
func TestRequestsForTwoAdaptersOfOneBaseModelNeverMatchEachOthersBlocks(t *testing.T) {
	simCfg := sim.DefaultConfig()
	simCfg.LoRAModules = []sim.LoRAModule{{Name: "lora-a", Path: "/adapters/a"}, {Name: "lora-b", Path: "/adapters/b"}}
	workers := map[string]string{}
	for range 2 {
		u, endpoint := eventWorker(t, simCfg)
		workers[u] = endpoint
	}
	tr := startEventRouter(t, testConfig(), workers)
	for _, w := range tr.Pool().All() {
		if base, ok := w.Adapter("lora-b"); !ok || base != "sim-model" {
			t.Fatalf("%s: Adapter(lora-b) = %q, %v", w.Name(), base, ok)
		}
	}

	// About 2,900 of the sim's tokens (180 blocks of 16): worth more prefill than a request of load.
	prompt := strings.Repeat("the schema of the orders table, its keys and its indexes. ", 200)
	send := func(model string) (worker, decision string, cached int) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"model": model, "max_tokens": 1,
			"messages": []map[string]string{{"role": "user", "content": prompt}}})
		resp := tr.post(t, "/v1/chat/completions", string(body))
		raw := readAll(t, resp)
		var reply chatReply
		if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(raw), &reply) != nil {
			t.Fatalf("%s: %d %s", model, resp.StatusCode, raw)
		}
		return resp.Header.Get("x-vllm-router-worker"), resp.Header.Get("x-vllm-router-decision"),
			reply.Usage.PromptTokensDetails.CachedTokens
	}
	blocksOn := func(worker string) int {
		for _, st := range tr.kvEvents.Status() {
			if string(st.Worker) == worker {
				return st.Blocks
			}
		}
		return 0
	}

	w, _, _ := send("lora-a")
	testkit.WaitFor(t, "lora-a's blocks in the index", func() bool { return blocksOn(w) >= 150 })

	if got, decision, cached := send("lora-a"); got != w || decision != "kv_events_match" || cached == 0 {
		t.Fatalf("lora-a again: %s on %s, %d cached tokens; want kv_events_match on %s, served from its cache", decision, got, cached, w)
	}
	for _, model := range []string{"lora-b", "sim-model"} {
		got, decision, cached := send(model)
		if decision == "kv_events_match" || cached != 0 {
			t.Fatalf("%s: %s on %s, %d cached tokens; want no match of lora-a's blocks (on %s) and none served from them",
				model, decision, got, cached, w)
		}
	}
	if v, _ := metricValue(t, tr, `vllm_router_tokenize_requests_total{result="ok"}`); v != 3 {
		t.Fatalf("tokenize ok = %v, want 3: one for each model (lora-a's repeat comes from the token cache)", v)
	}
}
