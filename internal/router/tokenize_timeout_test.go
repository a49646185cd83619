package router

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/sim"
)

// The wait for /tokenize grows with the prompt: against a render service that takes 250 ms
// whatever it is asked, a 2 KiB prompt is cut off at --tokenize-timeout-secs (0.1 s) plus its
// allowance (2 × 5 ms) and routes without its tokens, while a 700 KiB prompt, whose allowance
// is 3.5 s, gets them. (The margins are wide: 250 ms always outlasts 110 ms, and a loaded machine
// would have to take 14 times as long as the render service to cut off the long one.)
func TestTokenizeTimeoutGrowsWithThePrompt(t *testing.T) {
	render := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		select {
		case <-time.After(250 * time.Millisecond):
		case <-r.Context().Done():
			return
		}
		_, _ = io.WriteString(w, `{"count":3,"max_model_len":1048576,"tokens":[1,2,3]}`)
	}))
	t.Cleanup(render.Close)
	simCfg := sim.DefaultConfig()
	simCfg.MaxModelLen = 1 << 20   // 700 KiB is about 180k of the simulator's tokens
	simCfg.KVCacheBlocks = 1 << 15 // and fits in its cache
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.KVEventsWorkerEndpoints = map[string]string{}
	var urls []string
	for range 2 { // a request with one candidate is not tokenized
		u, endpoint := eventWorker(t, simCfg)
		cfg.KVEventsWorkerEndpoints[u] = endpoint
		urls = append(urls, u)
	}
	cfg.TokenizeURL = render.URL
	cfg.TokenizeTimeoutSecs = 0.1
	cfg.TokenizeTimeoutPerKiBMs = 5
	tr := startRouter(t, cfg)
	for _, u := range urls {
		if err := tr.AddWorker(t.Context(), u); err != nil {
			t.Fatal(err)
		}
	}
	tr.CheckHealth(t.Context())
	tr.Start(t.Context())
	waitStreamsHeard(t, urls, tr)

	for _, c := range []struct {
		kib    int
		result string
	}{{2, "timeout"}, {700, "ok"}} {
		before, _ := metricValue(t, tr, `vllm_router_tokenize_requests_total{result="`+c.result+`"}`)
		body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1,
			"messages": []map[string]string{{"role": "user", "content": strings.Repeat("a word ", c.kib<<10/7)}}})
		resp := tr.post(t, "/v1/chat/completions", string(body))
		if answer := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d KiB: %d %s", c.kib, resp.StatusCode, answer)
		}
		if after, _ := metricValue(t, tr, `vllm_router_tokenize_requests_total{result="`+c.result+`"}`); after != before+1 {
			t.Fatalf("%d KiB prompt: tokenize %s went from %v to %v, want one more", c.kib, c.result, before, after)
		}
	}
}
