package router

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
	"github.com/cacheroute/cacheroute/internal/sim"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// startDiallingSim starts a sim on a free loopback port whose publisher dials bind with the given
// topicOf(its host:port); it returns its URL and topic.
func startDiallingSim(t *testing.T, bind, topicOf func(hostPort string) string) (string, string) {
	t.Helper()
	hostPort := strings.TrimPrefix(kvtest.FreeEndpoint(t), "tcp://")
	cfg := instantSim()
	topic := topicOf(hostPort)
	cfg.KVEvents = sim.KVEventsConfig{Endpoint: bind(hostPort), Topic: topic}
	fleet, err := sim.Start([]string{hostPort}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	return fleet.URLs()[0], topic
}

// Sims whose publishers dial one endpoint the router binds, told apart by their topics: the
// blocks a sim's engine reports go to the worker its topic names (llm-d's kv@HOST:PORT@MODEL, or
// --kv-events-bind-topics ahead of it), so a request for a prompt the router never placed gets
// kv_events_match on that worker; a publisher whose topic names no worker is counted and dropped.
func TestPublishersDiallingTheBoundEndpointFeedTheWorkerTheirTopicNames(t *testing.T) {
	prompt := strings.Repeat("the release checklist, every step of it, in order. ", 100)
	body := `{"model":"sim-model","max_tokens":1,"messages":[{"role":"user","content":"` + prompt + `"}]}`
	for _, explicit := range []bool{false, true} {
		bind := kvtest.FreeEndpoint(t)
		dial := func(string) string { return bind }
		llmd := func(hp string) string { return "kv@" + hp + "@sim-model" }
		a, _ := startDiallingSim(t, dial, llmd)
		b, topicB := startDiallingSim(t, dial, llmd)
		stranger, _ := startDiallingSim(t, dial, func(string) string { return "kv@127.0.0.1:1@sim-model" }) // no worker of the fleet
		cfg := testConfig()
		cfg.Policy = "cache_aware"
		cfg.TokenizeTimeoutSecs = 10 // a shared machine: the test is about the topics, not the timeout
		cfg.KVEventsBind = bind
		want := b
		if explicit {
			cfg.KVEventsBindTopics = map[string]string{topicB: a} // the map wins over the topic's host:port
			want = a
		}
		tr := startRouter(t, cfg)
		for _, u := range []string{a, b} {
			if err := tr.AddWorker(t.Context(), u); err != nil {
				t.Fatal(err)
			}
		}
		tr.CheckHealth(t.Context())
		tr.Start(t.Context())
		// The prompt goes straight to b's engine, as another replica would have sent it.
		testkit.WaitFor(t, "b's engine's blocks in the index, under "+want, func() bool {
			for _, st := range tr.kvEvents.Status() {
				if string(st.Worker) == want && st.Blocks >= 50 {
					return true
				}
			}
			if resp, err := http.Post(b+"/reset_prefix_cache", "application/json", nil); err == nil {
				resp.Body.Close()
			}
			if resp, err := http.Post(b+"/v1/chat/completions", "application/json", strings.NewReader(body)); err == nil {
				resp.Body.Close()
			}
			return false
		})
		resp := tr.post(t, "/v1/chat/completions", body)
		if raw := readAll(t, resp); resp.StatusCode != http.StatusOK {
			t.Fatalf("%d %s", resp.StatusCode, raw)
		}
		if worker, decision := resp.Header.Get("x-vllm-router-worker"), resp.Header.Get("x-vllm-router-decision"); worker != want || decision != "kv_events_match" {
			t.Fatalf("explicit map %v: %s on %s, want kv_events_match on %s", explicit, decision, worker, want)
		}
		testkit.WaitFor(t, "the unknown topic's messages counted", func() bool {
			if v, ok := metricValue(t, tr, "vllm_router_kv_events_unknown_topic_total"); ok && v >= 1 {
				return true
			}
			if resp, err := http.Post(stranger+"/reset_prefix_cache", "application/json", nil); err == nil {
				resp.Body.Close() // an AllBlocksCleared under its topic
			}
			return false
		})
		if st := tr.kvEvents.Status(); len(st) != 2 {
			t.Fatalf("%d streams %+v, want the fleet's two and nothing for the unknown topic", len(st), st)
		}
	}
}

// A router told to bind an address another process holds stops at once with the reason, rather
// than running without the streams it was told to read.
func TestRouterRefusesToStartOnABindEndpointItCannotBind(t *testing.T) {
	held := testkit.Listen(t)
	defer held.Close()
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	cfg.KVEventsBind = "tcp://" + held.Addr().String()
	if _, err := New(cfg, slog.New(slog.DiscardHandler)); err == nil || !strings.Contains(err.Error(), "--kv-events-bind") {
		t.Fatalf("New with a held bind address: %v, want an error naming --kv-events-bind", err)
	}
}

// A publisher that dials the bound endpoint may still serve replays from a socket of its own, as
// vLLM's engine binds its replay endpoint whichever way its events go: with
// --kv-events-replay-endpoint, what the router missed before it bound (here the batches of a
// request sent before the router started) is asked for, and the worker's index is complete.
func TestAWorkerReadFromTheBoundEndpointReplaysWhatTheRouterMissed(t *testing.T) {
	bind := kvtest.FreeEndpoint(t)
	replayPort := strings.TrimPrefix(kvtest.FreeEndpoint(t), "tcp://127.0.0.1:")
	hostPort := strings.TrimPrefix(kvtest.FreeEndpoint(t), "tcp://")
	cfg := instantSim()
	cfg.KVEvents = sim.KVEventsConfig{Endpoint: bind, ReplayEndpoint: "tcp://127.0.0.1:" + replayPort, Topic: "kv@" + hostPort + "@sim-model"}
	fleet, err := sim.Start([]string{hostPort}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	u := fleet.URLs()[0]
	body := `{"model":"sim-model","max_tokens":1,"messages":[{"role":"user","content":"` + strings.Repeat("before the router listened. ", 40) + `"}]}`
	resp, err := http.Post(u+"/v1/chat/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close() // its blocks are published before anyone listens, and kept for replay

	rcfg := testConfig()
	rcfg.Policy = "cache_aware"
	rcfg.KVEventsBind = bind
	rcfg.KVEventsReplayEndpoint = "tcp://{host}:" + replayPort
	tr := startRouter(t, rcfg)
	if err := tr.AddWorker(t.Context(), u); err != nil {
		t.Fatal(err)
	}
	tr.CheckHealth(t.Context())
	tr.Start(t.Context())
	testkit.WaitFor(t, "the missed batches replayed", func() bool {
		st := tr.kvEvents.Status()
		if len(st) == 1 && st[0].Complete && st[0].Replays > 0 {
			return true
		}
		if resp, err := http.Post(u+"/reset_prefix_cache", "application/json", nil); err == nil {
			resp.Body.Close() // a batch heard, past the ones missed
		}
		return false
	})
}
