package router

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
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
	waitFor(t, "a published block in the index", func() bool {
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
	waitFor(t, "the removed worker's subscription and blocks to go", func() bool {
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
		srcs := tr.kvSources(t.Context(), map[string]resolvedEndpoints{})
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
	w := newFakeWorker(t)
	cfg := testConfig()
	cfg.KVEventsEndpoint = "tcp://{host}:" + pub.Endpoint[strings.LastIndex(pub.Endpoint, ":")+1:]
	tr := startRouter(t, cfg, w)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tr.Start(ctx)
	h := 0
	waitFor(t, "a published block in the index", func() bool {
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
