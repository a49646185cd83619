package router

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/cacheroute/cacheroute/internal/proxy"
)

// document is a distinct text of about 300 sim tokens.
func document(name string) string {
	var b strings.Builder
	for i := range 60 {
		fmt.Fprintf(&b, "%s section %d says %d. ", name, i, i*7)
	}
	return b.String()
}

func chatOn(doc, question string) string {
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 4, "messages": []map[string]string{
		{"role": "system", "content": doc}, {"role": "user", "content": question}}})
	return string(body)
}

// sendChat posts body to url's chat route and returns the answer's headers and usage.
func sendChat(t *testing.T, post func(path, body string) *http.Response, body string) (http.Header, chatReply) {
	t.Helper()
	resp := post("/v1/chat/completions", body)
	raw := readAll(t, resp)
	var reply chatReply
	if resp.StatusCode != http.StatusOK || json.Unmarshal([]byte(raw), &reply) != nil {
		t.Fatalf("%d %s", resp.StatusCode, raw)
	}
	return resp.Header, reply
}

// A worker whose small cache evicted two documents the router taught it: the router sends a
// conversation after one of them there, the worker reports it served none of it from cache, and
// from then on the router no longer counts on that worker for the other one either. The metrics
// show the predicted and achieved cached tokens and the correction.
func TestAWorkerReportingItEvictedIsNoLongerCountedOn(t *testing.T) {
	simCfg := instantSim()
	simCfg.KVCacheBlocks = 48 // 768 tokens: two documents of about 300, not five
	fleet := startSimFleetOf(t, 2, simCfg)
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	tr := startRouter(t, cfg)
	routed := func(path, body string) *http.Response { return tr.post(t, path, body) }
	holder := fleet.URLs()[0]
	if err := tr.AddWorker(t.Context(), holder); err != nil { // the holder alone, so both documents land on it
		t.Fatal(err)
	}
	older, newer := document("manual"), document("contract")
	sendChat(t, routed, chatOn(older, "What does it cover?"))
	sendChat(t, routed, chatOn(newer, "What does it cover?"))
	if err := tr.AddWorker(t.Context(), fleet.URLs()[1]); err != nil {
		t.Fatal(err)
	}

	// Other clients (another router replica, say) fill the holder's cache behind this router's back.
	direct := func(path, body string) *http.Response {
		resp, err := http.Post(holder+path, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		return resp
	}
	for i := range 3 {
		sendChat(t, direct, chatOn(document(fmt.Sprintf("other-%d", i)), "Summarise."))
	}

	// The router still predicts the contract on the holder, which has to prefill it all again.
	h, reply := sendChat(t, routed, chatOn(newer, "Which clause matters most?"))
	if h.Get(proxy.HeaderWorker) != holder || h.Get(proxy.HeaderDecision) != "cache_affinity" {
		t.Fatalf("the contract's conversation: %s on %s, want cache_affinity on the holder %s", h.Get(proxy.HeaderDecision), h.Get(proxy.HeaderWorker), holder)
	}
	if cached := reply.Usage.PromptTokensDetails.CachedTokens; cached > reply.Usage.PromptTokens/4 {
		t.Fatalf("the holder served %d of %d prompt tokens from cache; the test needs it to have evicted the contract", cached, reply.Usage.PromptTokens)
	}
	m := tr.Metrics()
	if got := testutil.ToFloat64(m.CacheCorrections.WithLabelValues(holder)); got != 1 {
		t.Fatalf("corrections on the holder: %v, want 1", got)
	}
	predicted := testutil.ToFloat64(m.CachedTokensPredicted.WithLabelValues(holder, "cache_affinity"))
	achieved := testutil.ToFloat64(m.CachedTokensAchieved.WithLabelValues(holder, "cache_affinity"))
	if prompt := testutil.ToFloat64(m.PromptTokens.WithLabelValues(holder, "cache_affinity")); prompt != float64(reply.Usage.PromptTokens) || predicted < prompt/2 || achieved != float64(reply.Usage.PromptTokensDetails.CachedTokens) {
		t.Fatalf("prompt %v, predicted %v, achieved %v cached tokens; the answer said %d prompt, %d cached",
			prompt, predicted, achieved, reply.Usage.PromptTokens, reply.Usage.PromptTokensDetails.CachedTokens)
	}

	// The manual, taught to the holder before the contract, is no longer counted on.
	h, _ = sendChat(t, routed, chatOn(older, "Which chapter explains setup?"))
	if d := h.Get(proxy.HeaderDecision); d != "low_match_min_load" {
		t.Fatalf("a conversation on the evicted manual after the correction: %s on %s, want low_match_min_load", d, h.Get(proxy.HeaderWorker))
	}

	// A removed worker's series go with it, so a fleet that turns over keeps a bounded set.
	if err := tr.RemoveWorker(holder); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.CacheCorrections.WithLabelValues(holder)) + testutil.ToFloat64(m.PromptTokens.WithLabelValues(holder, "cache_affinity")); got != 0 {
		t.Fatalf("the removed worker's cache series still count %v", got)
	}
}

// vLLM leaves prompt_tokens_details out of its usage unless it runs with
// --enable-prompt-tokens-details: an answer that does not say what it served from cache must not
// read as "nothing cached", or every prediction would be corrected away.
func TestAnswersWithoutACachedCountCheckNothing(t *testing.T) {
	fw := newFakeWorker(t)
	fw.setHandler(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":400,"completion_tokens":1}}`))
	})
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	tr := startRouter(t, cfg, fw)
	doc := document("handbook")
	for _, q := range []string{"first?", "second?", "third?"} {
		resp := tr.post(t, "/v1/chat/completions", strings.Replace(chatOn(doc, q), "sim-model", "test-model", 1))
		if raw := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		if q != "first?" && resp.Header.Get(proxy.HeaderDecision) != "cache_affinity" {
			t.Fatalf("%s: %s, want cache_affinity: the prediction must stand", q, resp.Header.Get(proxy.HeaderDecision))
		}
	}
	m := tr.Metrics()
	if n := counterSum(t, m.CacheCorrections) + counterSum(t, m.PromptTokens); n != 0 {
		t.Fatalf("%v corrections or prompt tokens counted from answers without a cached count, want none", n)
	}
}

// counterSum is the sum of every series of vec.
func counterSum(t *testing.T, vec *prometheus.CounterVec) float64 {
	t.Helper()
	ch := make(chan prometheus.Metric)
	go func() { vec.Collect(ch); close(ch) }()
	sum := 0.0
	for metric := range ch {
		var out dto.Metric
		if err := metric.Write(&out); err != nil {
			t.Fatal(err)
		}
		sum += out.GetCounter().GetValue()
	}
	return sum
}
