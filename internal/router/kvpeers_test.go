package router

import (
	"context"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
)

// A worker whose engine stores blocks after a parent the router never saw indexes nothing; those
// blocks are counted per worker in the metrics and named in the worker list.
func TestRouterCountsAndListsAWorkersOrphanedBlocks(t *testing.T) {
	pub := kvtest.New(t, "", false)
	w := newFakeWorker(t)
	cfg := testConfig()
	cfg.KVEventsEndpoint = "tcp://{host}:" + pub.Endpoint[strings.LastIndex(pub.Endpoint, ":")+1:]
	tr := startRouter(t, cfg, w)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tr.Start(ctx)
	tokens := make([]int, 32)
	orphans, err := msgpack.Marshal([]any{2.5, []any{[]any{"BlockStored", []any{7, 8}, 999_999, tokens, 16, nil, "GPU", nil, nil}}, nil})
	if err != nil {
		t.Fatal(err)
	}
	series := `vllm_router_kv_events_orphaned_blocks_total{worker="` + w.URL() + `"}`
	waitFor(t, "orphaned blocks counted", func() bool {
		pub.Send(orphans, false) // until the subscription has joined
		v, ok := metricValue(t, tr, series)
		return ok && v >= 2
	})
	if ev := listed(t, tr, w.URL()).KVEvents; ev == nil || ev.OrphanedBlocks < 2 || ev.Blocks != 0 {
		t.Fatalf("the worker list shows %+v, want its orphaned blocks and none indexed", ev)
	}
}
