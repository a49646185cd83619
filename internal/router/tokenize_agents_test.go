package router

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/anthropics/anthropic-sdk-go/v2"
	anthropicoption "github.com/anthropics/anthropic-sdk-go/v2/option"
	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
	"github.com/openai/openai-go/v3/responses"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/proxy"
	"github.com/cacheroute/cacheroute/internal/sim"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// eventRouters starts two simulated workers publishing their KV-cache events over ZMQ on
// loopback, and two routers that share nothing (cache_aware, --cache-index events), each
// subscribed to both workers: what one router places, the other can know only from the events.
func eventRouters(t *testing.T) (a, b *testRouter, workers []string) {
	t.Helper()
	endpoints := map[string]string{}
	for range 2 {
		u, ep := eventWorker(t, sim.DefaultConfig())
		workers = append(workers, u)
		endpoints[u] = ep
	}
	start := func() *testRouter {
		cfg := testConfig()
		cfg.Policy = "cache_aware"
		cacheaware.KnobsIn(cfg.PolicyOptions).CacheIndex = cacheaware.IndexEvents
		cfg.KVEventsWorkerEndpoints = endpoints
		cfg.TokenizeTimeoutSecs = 10 // a slow shared machine must not turn the test into a timeout
		tr := startRouter(t, cfg)
		for _, u := range workers {
			if err := tr.AddWorker(t.Context(), u); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		t.Cleanup(cancel)
		tr.Start(ctx)
		return tr
	}
	a, b = start(), start()
	waitStreamsHeard(t, workers, a, b)
	return a, b, workers
}

// eventWorker starts one simulated worker of cfg (time scale 0) publishing its KV-cache events on
// a free loopback endpoint, which it returns with the worker's URL.
func eventWorker(t *testing.T, cfg sim.Config) (url, endpoint string) {
	t.Helper()
	cfg.TimeScale = 0
	cfg.KVEvents = sim.KVEventsConfig{Endpoint: kvtest.FreeEndpoint(t), Bind: true}
	fleet := startSimFleetOf(t, 1, cfg)
	return fleet.URLs()[0], cfg.KVEvents.Endpoint
}

// eventWorkers starts n simulated workers of the default configuration, each publishing its
// KV-cache events on an endpoint of its own, and returns them by URL.
func eventWorkers(t *testing.T, n int) map[string]string {
	t.Helper()
	ws := map[string]string{}
	for range n {
		u, endpoint := eventWorker(t, sim.DefaultConfig())
		ws[u] = endpoint
	}
	return ws
}

// startEventRouter starts a cache_aware router of cfg in front of the workers (URL → event
// endpoint), subscribed to their events and probed once, and waits until it heard every stream.
func startEventRouter(t *testing.T, cfg config.Config, workers map[string]string) *testRouter {
	t.Helper()
	cfg.Policy = "cache_aware"
	cfg.TokenizeTimeoutSecs = 10 // a shared machine: the tests are about what is asked, not the timeout
	cfg.KVEventsWorkerEndpoints = workers
	tr := startRouter(t, cfg)
	urls := make([]string, 0, len(workers))
	for u := range workers {
		if err := tr.AddWorker(t.Context(), u); err != nil {
			t.Fatal(err)
		}
		urls = append(urls, u)
	}
	tr.CheckHealth(t.Context()) // each worker's models, adapters among them
	tr.Start(t.Context())
	waitStreamsHeard(t, urls, tr)
	return tr
}

// waitStreamsHeard waits until each router has heard each worker's event stream. A subscriber
// hears only what is published after it joined, so until then each worker's cache is reset,
// which publishes an AllBlocksCleared: a test's first prompt is then published to every router.
func waitStreamsHeard(t *testing.T, workers []string, routers ...*testRouter) {
	t.Helper()
	testkit.WaitFor(t, "every worker's event stream heard by every router", func() bool {
		heard := 0
		for _, tr := range routers {
			for _, st := range tr.kvEvents.Status() {
				if st.Batches > 0 {
					heard++
				}
			}
		}
		if heard == len(workers)*len(routers) {
			return true
		}
		for _, u := range workers {
			if resp, err := http.Post(u+"/reset_prefix_cache", "application/json", nil); err == nil {
				resp.Body.Close()
			}
		}
		return false
	})
}

// waitIndexed waits until tr's index holds a block of worker's.
func waitIndexed(t *testing.T, tr *testRouter, worker string) {
	t.Helper()
	testkit.WaitFor(t, "the worker's blocks in the second router's index", func() bool {
		v, ok := metricValue(t, tr, `vllm_router_kv_events_index_blocks{worker="`+worker+`"}`)
		return ok && v >= 1
	})
}

// tokenizeCount is tr's /tokenize calls and token-cache answers, all results together.
func tokenizeCount(t *testing.T, tr *testRouter) float64 {
	t.Helper()
	var sum float64
	for _, r := range []string{metrics.TokenizeOK, metrics.TokenizeError, metrics.TokenizeTimeout, metrics.TokenizeCached} {
		v, _ := metricValue(t, tr, `vllm_router_tokenize_requests_total{result="`+r+`"}`)
		sum += v
	}
	return sum
}

// secondRouterFollowsTheEvents sends one request through router a and, once router b's index
// holds blocks of the worker that served it, the same request through b: b, which shares nothing
// with a but the engines' events, must place it on that worker by kv_events_match, having asked
// /tokenize once for it. ask sends the request through a router and returns the serving worker
// and the decision label.
func secondRouterFollowsTheEvents(t *testing.T, a, b *testRouter, ask func(tr *testRouter) (worker, decision string)) {
	t.Helper()
	first, _ := ask(a)
	waitIndexed(t, b, first)
	before := tokenizeCount(t, b)
	if w, d := ask(b); w != first || d != cacheaware.LabelKVEventsMatch {
		t.Fatalf("the second router sent it to %s (%s); the engine of %s holds its prefix", w, d, first)
	}
	if after := tokenizeCount(t, b); after != before+1 {
		t.Fatalf("the second router's /tokenize calls went from %v to %v, want one more", before, after)
	}
}

// agentPrompt is a long first user message, several blocks of the simulator's tokens.
func agentPrompt(tag string) string {
	return tag + ": " + strings.Repeat("read the repository and list the packages that touch the network, ", 20)
}

func TestMessagesWithoutSessionRouteByTheEnginesEvents(t *testing.T) {
	a, b, _ := eventRouters(t)
	ask := func(tr *testRouter) (worker, decision string) {
		client := anthropicClient(tr.url, http.DefaultClient)
		var raw *http.Response
		_, err := client.Messages.New(t.Context(), anthropic.MessageNewParams{
			Model: "sim-model", MaxTokens: 4,
			System:   []anthropic.TextBlockParam{{Text: "You are a coding agent."}},
			Messages: []anthropic.MessageParam{anthropic.NewUserMessage(anthropic.NewTextBlock(agentPrompt("messages")))},
		}, anthropicoption.WithResponseInto(&raw))
		if err != nil {
			t.Fatal(err)
		}
		return raw.Header.Get(proxy.HeaderWorker), raw.Header.Get(proxy.HeaderDecision)
	}
	secondRouterFollowsTheEvents(t, a, b, ask)
}

func TestResponsesWithoutPreviousResponseRouteByTheEnginesEvents(t *testing.T) {
	a, b, _ := eventRouters(t)
	ask := func(tr *testRouter) (worker, decision string) {
		client := openAIClient(tr.url, http.DefaultClient)
		var raw *http.Response
		params := responses.ResponseNewParams{Model: "sim-model", Instructions: openai.String("You are a coding agent."),
			MaxOutputTokens: openai.Int(4), Store: openai.Bool(false)}
		params.Input.OfString = openai.String(agentPrompt("responses"))
		if _, err := client.Responses.New(t.Context(), params, option.WithResponseInto(&raw)); err != nil {
			t.Fatal(err)
		}
		return raw.Header.Get(proxy.HeaderWorker), raw.Header.Get(proxy.HeaderDecision)
	}
	secondRouterFollowsTheEvents(t, a, b, ask)
}

// A body whose chat rendering cannot be known exactly (here a Messages image block, a Responses
// reasoning item) is not tokenized, and routes as without events.
func TestBodiesNotRenderedExactlyAreNotTokenizedAndStillRoute(t *testing.T) {
	_, b, workers := eventRouters(t)
	bodies := map[string]string{
		"/v1/messages": `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":[{"type":"text","text":"what is in it?"},` +
			`{"type":"image","source":{"type":"url","url":"http://127.0.0.1/cat.png"}}]}]}`,
		"/v1/responses": `{"model":"sim-model","max_output_tokens":4,"store":false,"input":[{"role":"user","content":"hi"},` +
			`{"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"hm"}]},{"role":"user","content":"go on"}]}`,
	}
	for path, body := range bodies {
		before := tokenizeCount(t, b)
		resp := b.post(t, path, body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("%s: status %d", path, resp.StatusCode)
		}
		if w := resp.Header.Get(proxy.HeaderWorker); w != workers[0] && w != workers[1] {
			t.Fatalf("%s: routed to %q", path, w)
		}
		if d := resp.Header.Get(proxy.HeaderDecision); d == cacheaware.LabelKVEventsMatch {
			t.Fatalf("%s: placed by the events without its tokens", path)
		}
		if after := tokenizeCount(t, b); after != before {
			t.Fatalf("%s: /tokenize counted %v then %v: a body not rendered exactly was tokenized", path, before, after)
		}
	}
}

// A completion's prompt is tokenized as the engine tokenizes it (/tokenize with the prompt), so a
// second router that shares nothing with the first places the same prompt where the first did,
// by the events; a batch of prompts is not tokenized, and still routes.
func TestCompletionsWithOnePromptRouteByTheEnginesEvents(t *testing.T) {
	a, b, _ := eventRouters(t)
	ask := func(tr *testRouter, prompt any) (worker, decision string) {
		client := openAIClient(tr.url, http.DefaultClient)
		var raw *http.Response
		params := openai.CompletionNewParams{Model: "sim-model", MaxTokens: openai.Int(4)}
		switch p := prompt.(type) {
		case string:
			params.Prompt.OfString = openai.String(p)
		case []string:
			params.Prompt.OfArrayOfStrings = p
		}
		if _, err := client.Completions.New(t.Context(), params, option.WithResponseInto(&raw)); err != nil {
			t.Fatal(err)
		}
		return raw.Header.Get(proxy.HeaderWorker), raw.Header.Get(proxy.HeaderDecision)
	}
	secondRouterFollowsTheEvents(t, a, b, func(tr *testRouter) (string, string) { return ask(tr, agentPrompt("completion")) })
	before := tokenizeCount(t, b)
	if _, d := ask(b, []string{agentPrompt("batch one"), agentPrompt("batch two")}); d == cacheaware.LabelKVEventsMatch {
		t.Fatalf("a batch of prompts: %s", d)
	}
	if after := tokenizeCount(t, b); after != before {
		t.Fatalf("a batch of prompts was tokenized: %v calls, then %v", before, after)
	}
}
