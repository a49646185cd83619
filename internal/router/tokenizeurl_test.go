package router

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// With --tokenize-url the router asks a render service, not a worker, for a request's tokens: a
// simulated engine outside the fleet tokenizes as the workers do, and a request for a prompt a
// worker's engine published is placed there by the events; with the URL at a port nothing listens
// on, every ask fails (the workers are not asked instead) and the request still routes.
func TestTokensAreAskedOfTheRenderServiceWhenOneIsGiven(t *testing.T) {
	simCfg := instantSim()
	render := startSimFleetOf(t, 1, simCfg)
	closed := testkit.Listen(t)
	nobody := "http://" + closed.Addr().String()
	closed.Close()

	prompt := strings.Repeat("the deployment runbook, every step of it. ", 120)
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 1,
		"messages": []map[string]string{{"role": "user", "content": prompt}}})
	for _, c := range []struct {
		url, result string
	}{{render.URLs()[0], "ok"}, {nobody, "error"}} {
		u, endpoint := eventWorker(t, simCfg)
		other, otherEndpoint := eventWorker(t, simCfg) // a request with one candidate is not tokenized
		cfg := testConfig()
		cfg.TokenizeURL = c.url
		tr := startEventRouter(t, cfg, map[string]string{u: endpoint, other: otherEndpoint})
		resp, err := http.Post(u+"/v1/chat/completions", "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close() // the worker's engine holds the prompt now, and publishes it
		testkit.WaitFor(t, "the prompt's blocks in the index", func() bool {
			held := 0
			for _, st := range tr.kvEvents.Status() {
				held += st.Blocks
			}
			return held >= 50
		})
		routed := tr.post(t, "/v1/chat/completions", string(body))
		if raw := readAll(t, routed); routed.StatusCode != http.StatusOK {
			t.Fatalf("%s: %d %s", c.url, routed.StatusCode, raw)
		}
		if v, _ := metricValue(t, tr, `vllm_router_tokenize_requests_total{result="`+c.result+`"}`); v != 1 {
			t.Fatalf("%s: tokenize %s = %v, want 1", c.url, c.result, v)
		}
		if d := routed.Header.Get("x-vllm-router-decision"); (c.result == "ok") != (d == "kv_events_match") {
			t.Fatalf("%s: decision %s", c.url, d)
		}
	}
}
