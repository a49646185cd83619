package router

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// storedBatch is an engine's batch storing one 16-token block with hash h, in the map encoding.
func storedBatch(t *testing.T, h int) []byte {
	t.Helper()
	tokens := make([]int, 16)
	for i := range tokens {
		tokens[i] = h*16 + i
	}
	b, err := msgpack.Marshal(map[string]any{"ts": 1.5, "events": []any{map[string]any{
		"type": "BlockStored", "block_hashes": []any{h}, "parent_block_hash": nil, "token_ids": tokens,
		"block_size": 16, "lora_id": nil, "medium": "GPU", "lora_name": nil,
	}}})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestRouterIndexesTheBlocksEachWorkerPublishesAndDropsARemovedWorker(t *testing.T) {
	pub := kvtest.New(t, "", false)
	port := pub.Endpoint[strings.LastIndex(pub.Endpoint, ":")+1:]
	w := newFakeWorker(t)
	cfg := testConfig()
	cfg.KVEventsEndpoint = "tcp://{host}:" + port
	tr := startRouter(t, cfg, w)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tr.Start(ctx)

	blocks := `vllm_router_kv_events_index_blocks{worker="` + w.URL() + `"}`
	h := 0
	testkit.WaitFor(t, "a published block in the index", func() bool {
		h++
		pub.Send(storedBatch(t, h), false) // until the subscription has joined: each is a block of its own
		v, ok := metricValue(t, tr, blocks)
		return ok && v >= 1
	})
	if v, ok := metricValue(t, tr, `vllm_router_kv_events_batches_total{worker="`+w.URL()+`"}`); !ok || v < 1 {
		t.Fatalf("batches_total %v (present %v)", v, ok)
	}
	if v, ok := metricValue(t, tr, "vllm_router_kv_events_index_bytes"); !ok || v <= 0 {
		t.Fatalf("index_bytes %v (present %v)", v, ok)
	}

	var page struct {
		Workers []struct {
			Name     string `json:"name"`
			KVEvents *struct {
				Blocks  int   `json:"blocks"`
				Batches int64 `json:"batches"`
			} `json:"kv_events"`
		} `json:"workers"`
	}
	if err := json.Unmarshal([]byte(readAll(t, mustGet(t, tr.url+"/dashboard/data"))), &page); err != nil {
		t.Fatal(err)
	}
	if len(page.Workers) != 1 || page.Workers[0].KVEvents == nil || page.Workers[0].KVEvents.Blocks < 1 || page.Workers[0].KVEvents.Batches < 1 {
		t.Fatalf("the status page's data shows no indexed block: %+v", page.Workers)
	}

	if status, body := adminCall(t, tr, http.MethodPost, "/remove_worker?url="+url.QueryEscape(w.URL()), ""); status != http.StatusOK {
		t.Fatalf("remove_worker: %d %s", status, body)
	}
	testkit.WaitFor(t, "the removed worker's subscription and blocks to go", func() bool {
		_, ok := metricValue(t, tr, blocks)
		v, _ := metricValue(t, tr, "vllm_router_kv_events_index_bytes")
		return !ok && v == 0
	})
}

func TestRouterDoesNotSubscribeToAWorkerOutsideTheAllowList(t *testing.T) {
	w := newFakeWorker(t)
	byName := strings.Replace(w.URL(), "127.0.0.1", "localhost", 1) // admitted by name, resolved when dialled
	for _, c := range []struct {
		allow []string
		want  int
	}{{nil, 1}, {[]string{"127.0.0.0/8"}, 1}, {[]string{"192.0.2.0/24"}, 0}} { // 192.0.2.0/24: documentation only
		cfg := testConfig()
		cfg.KVEventsEndpoint = "tcp://{host}:5557"
		cfg.WorkerURLAllow = c.allow
		tr := startRouter(t, cfg)
		if err := tr.AddWorker(t.Context(), byName); err != nil {
			t.Fatal(err)
		}
		srcs := tr.kvSources(t.Context(), map[tenant.ID]resolvedEndpoints{})
		if len(srcs) != c.want {
			t.Fatalf("--worker-url-allow %v: %d subscriptions %+v, want %d", c.allow, len(srcs), srcs, c.want)
		}
		if c.allow != nil && c.want == 1 && srcs[0].Endpoint != "tcp://127.0.0.1:5557" {
			t.Fatalf("with an allow-list the endpoint is %q, want the checked address", srcs[0].Endpoint)
		}
	}
}

func TestDashboardShowsEachWorkersKVEventIndex(t *testing.T) {
	exe := browser(t)
	pub := kvtest.New(t, "", false)
	tr, w := startSubscribed(t, pub)
	h := 0
	testkit.WaitFor(t, "a published block in the index", func() bool {
		h++
		pub.Send(storedBatch(t, h), false)
		st := tr.kvEvents.Status()
		return len(st) == 1 && st[0].Blocks >= 1
	})
	st := tr.kvEvents.Status()[0]
	want := "incomplete"
	if st.Complete {
		want = "complete"
	}
	bctx := newBrowser(t, exe)
	check := fmt.Sprintf(`(() => {
		const row = Array.from(document.querySelectorAll("#workers tr.worker")).find(r => r.dataset.name === %q);
		return !!row && /^[1-9][0-9]* blocks, %s$/.test(row.querySelector("td.kv-events").textContent) &&
			document.querySelector("#workers thead").innerText.includes("KV events");
	})()`, w.URL(), want)
	err := chromedp.Do(bctx,
		chromedp.Navigate(tr.url+"/dashboard"),
		chromedp.WaitVisible(chromedp.CSS(`body[data-ready="1"]`)),
		chromedp.Poll[chromedp.Void](check, chromedp.WithPollingTimeout(30*time.Second)),
	)
	if err != nil {
		cell, _ := chromedp.Run(bctx, chromedp.Evaluate[string](`(document.querySelector("#workers td.kv-events") || {}).textContent`))
		t.Fatalf("the worker's row does not show its indexed blocks (%s): %v; the cell reads %q", want, err, cell)
	}
}

// tokenizingWorker is a worker on the loopback address host that serves /tokenize as an engine
// does for the chats of these tests: one token per byte of the messages' text. It counts the
// chats it answers.
type tokenizingWorker struct {
	url   string
	chats atomic.Int64
}

func newTokenizingWorker(t *testing.T, host string) *tokenizingWorker {
	t.Helper()
	w := &tokenizingWorker{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(http.ResponseWriter, *http.Request) {})
	mux.HandleFunc("GET /v1/models", func(rw http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(rw, `{"object":"list","data":[{"id":"test-model","object":"model"}]}`)
	})
	mux.HandleFunc("POST /tokenize", func(rw http.ResponseWriter, r *http.Request) {
		var ask struct {
			Messages []struct {
				Content string `json:"content"`
			} `json:"messages"`
			AddGenerationPrompt bool `json:"add_generation_prompt"`
		}
		if err := json.NewDecoder(r.Body).Decode(&ask); err != nil || !ask.AddGenerationPrompt {
			http.Error(rw, "bad tokenize request", http.StatusBadRequest)
			return
		}
		_ = json.NewEncoder(rw).Encode(map[string]any{"tokens": promptTokensOf(ask.Messages[0].Content)})
	})
	mux.HandleFunc("POST /v1/chat/completions", func(rw http.ResponseWriter, _ *http.Request) {
		w.chats.Add(1)
		_, _ = io.WriteString(rw, `{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)
	})
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: mux}}
	srv.Start()
	t.Cleanup(srv.Close)
	w.url = srv.URL
	return w
}

func promptTokensOf(text string) []int {
	out := make([]int, len(text))
	for i := range text {
		out[i] = int(text[i])
	}
	return out
}

// storedBlocks is a batch storing the first n 16-token blocks of tokens, hashes 1 … n.
func storedBlocks(t *testing.T, tokens []int, n int) []byte {
	t.Helper()
	hashes := make([]any, n)
	for i := range hashes {
		hashes[i] = i + 1
	}
	b, err := msgpack.Marshal([]any{2.5, []any{[]any{"BlockStored", hashes, nil, tokens[:n*16], 16, nil, "GPU", nil, nil}}, nil})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// Two workers on two loopback addresses, each with its engine's event publisher on the same
// port. The second worker's engine reports it holds a prompt this router never placed (another
// replica did): a request for it without session id goes there, by the events, where the prefix
// tree alone knows nothing of it.
func TestRequestWithoutSessionFollowsTheEngineThatReportsItsPrompt(t *testing.T) {
	port := strings.TrimPrefix(kvtest.FreeEndpoint(t), "tcp://127.0.0.1:")
	pubA := kvtest.New(t, "tcp://127.0.0.1:"+port, false)
	pubB := kvtest.New(t, "tcp://127.0.0.2:"+port, false)
	a, b := newTokenizingWorker(t, "127.0.0.1"), newTokenizingWorker(t, "127.0.0.2")
	prompt := strings.Repeat("the repository's build notes, long enough for many blocks. ", 20)
	body := `{"model":"test-model","messages":[{"role":"user","content":"` + prompt + `"}]}`

	for _, events := range []bool{false, true} {
		cfg := testConfig()
		cfg.Policy = "cache_aware"
		if events {
			cfg.KVEventsEndpoint = "tcp://{host}:" + port
		}
		tr := startRouter(t, cfg)
		for _, w := range []*tokenizingWorker{a, b} {
			if err := tr.AddWorker(t.Context(), w.url); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithCancel(t.Context())
		tr.Start(ctx)
		if events {
			testkit.WaitFor(t, "the second engine's blocks in the index", func() bool {
				pubA.Send(storedBatch(t, 999), false) // the first engine holds something else
				pubB.Send(storedBlocks(t, promptTokensOf(prompt), 40), false)
				st := tr.kvEvents.Status()
				return len(st) == 2 && st[0].Blocks > 0 && st[1].Blocks >= 40
			})
		}
		resp := tr.post(t, "/v1/chat/completions", body)
		readAll(t, resp)
		worker, decision := resp.Header.Get("x-vllm-router-worker"), resp.Header.Get("x-vllm-router-decision")
		if events && (worker != b.url || decision != "kv_events_match") {
			t.Fatalf("with events: %s on %s, want kv_events_match on %s", decision, worker, b.url)
		}
		if !events && decision == "kv_events_match" {
			t.Fatalf("without events: %s", decision)
		}
		if events {
			if v, ok := metricValue(t, tr, `vllm_router_tokenize_requests_total{result="ok"}`); !ok || v != 1 {
				t.Fatalf("tokenize ok = %v (present %v), want 1", v, ok)
			}
			// The same prompt again is not tokenized again; a new session is asked once, to record
			// its first block, and its next turn, whose worker's engine holds it, not at all.
			readAll(t, tr.post(t, "/v1/chat/completions", body))
			readAll(t, tr.post(t, "/v1/chat/completions", body, "x-session-id", "s-1"))
			next := tr.post(t, "/v1/chat/completions", body, "x-session-id", "s-1")
			readAll(t, next)
			if d := next.Header.Get("x-vllm-router-decision"); d != "session_id_match" {
				t.Fatalf("the session's next turn: %s, want session_id_match", d)
			}
			if v, _ := metricValue(t, tr, `vllm_router_tokenize_requests_total{result="ok"}`); v != 1 {
				t.Fatalf("tokenize ok = %v after a repeat and a session's turns, want still 1", v)
			}
			if v, _ := metricValue(t, tr, `vllm_router_tokenize_requests_total{result="cached"}`); v != 2 {
				t.Fatalf("tokenize cached = %v, want 2: the repeat and the session's first turn", v)
			}
		}
		cancel()
	}
}

func TestWorkerEndpointsNameSingleWorkersStreamsInPlaceOfTheTemplate(t *testing.T) {
	byName := func(w *fakeWorker) string { return strings.Replace(w.URL(), "127.0.0.1", "localhost", 1) }
	own, other := byName(newFakeWorker(t)), byName(newFakeWorker(t))
	for _, c := range []struct {
		allow []string
		want  int
	}{{nil, 1}, {[]string{"192.0.2.0/24"}, 0}} { // 192.0.2.0/24: documentation only
		cfg := testConfig()
		cfg.KVEventsWorkerEndpoints = map[string]string{own + "/": "tcp://localhost:6001"}
		cfg.WorkerURLAllow = c.allow
		tr := startRouter(t, cfg)
		for _, u := range []string{own, other} {
			if err := tr.AddWorker(t.Context(), u); err != nil {
				t.Fatal(err)
			}
		}
		srcs := tr.kvSources(t.Context(), map[tenant.ID]resolvedEndpoints{})
		if len(srcs) != c.want {
			t.Fatalf("--worker-url-allow %v: %+v, want %d subscription", c.allow, srcs, c.want)
		}
		if c.want == 1 && (string(srcs[0].Worker) != own || srcs[0].Endpoint != "tcp://localhost:6001") {
			t.Fatalf("%+v, want the worker's own endpoint, and none for the worker without one and without a template", srcs[0])
		}
	}
}
