package router

import (
	"context"
	"net"
	"net/url"
	"strings"
	"testing"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// startSubscribed starts a router in front of one worker, subscribed to pub's events at the
// worker's host, until the test ends.
func startSubscribed(t *testing.T, pub *kvtest.Publisher) (*testRouter, *fakeWorker) {
	t.Helper()
	w := newFakeWorker(t)
	cfg := testConfig()
	cfg.KVEventsEndpoint = "tcp://{host}:" + pub.Endpoint[strings.LastIndex(pub.Endpoint, ":")+1:]
	tr := startRouter(t, cfg, w)
	ctx, cancel := context.WithCancel(t.Context())
	t.Cleanup(cancel)
	tr.Start(ctx)
	return tr, w
}

// A worker whose engine stores blocks after a parent the router never saw indexes nothing; those
// blocks are counted per worker in the metrics and named in the worker list.
func TestRouterCountsAndListsAWorkersOrphanedBlocks(t *testing.T) {
	pub := kvtest.New(t, "", false)
	tr, w := startSubscribed(t, pub)
	tokens := make([]int, 32)
	orphans, err := msgpack.Marshal([]any{2.5, []any{[]any{"BlockStored", []any{7, 8}, 999_999, tokens, 16, nil, "GPU", nil, nil}}, nil})
	if err != nil {
		t.Fatal(err)
	}
	series := `vllm_router_kv_events_orphaned_blocks_total{worker="` + w.URL() + `"}`
	testkit.WaitFor(t, "orphaned blocks counted", func() bool {
		pub.Send(orphans, false) // until the subscription has joined
		v, ok := metricValue(t, tr, series)
		return ok && v >= 2
	})
	if ev := listed(t, tr, w.URL()).KVEvents; ev == nil || ev.OrphanedBlocks < 2 || ev.Blocks != 0 {
		t.Fatalf("the worker list shows %+v, want its orphaned blocks and none indexed", ev)
	}
}

// A peer that dials the --kv-events-bind endpoint, completes the handshake as a publisher and
// announces a frame of 2^62 bytes crashed the router: zmq4 allocates what a frame header
// announces. The router closes that connection, counts it, and reads the publishers that follow.
func TestRouterSurvivesAPublisherAnnouncingAHugeFrame(t *testing.T) {
	w := newFakeWorker(t)
	cfg := testConfig()
	cfg.KVEventsBind = kvtest.FreeEndpoint(t)
	tr := startRouter(t, cfg, w)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	tr.Start(ctx)
	testkit.WaitFor(t, "the bound endpoint", func() bool {
		c, err := net.Dial("tcp", strings.TrimPrefix(cfg.KVEventsBind, "tcp://"))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	hostile := kvtest.DialAsPublisher(t, cfg.KVEventsBind)
	_, _ = hostile.Write(kvtest.FrameHeader(0, 1<<62))
	if !kvtest.Closed(hostile) {
		t.Fatal("the connection is still open")
	}
	if v, ok := metricValue(t, tr, `vllm_router_kv_events_dropped_connections_total{reason="oversized"}`); !ok || v != 1 {
		t.Fatalf("dropped_connections_total{reason=oversized} %v (present %v), want 1", v, ok)
	}

	pub := zmq4.NewPub(ctx)
	defer pub.Close()
	if err := pub.Dial(cfg.KVEventsBind); err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse(w.URL())
	topic := []byte("kv@" + u.Host + "@test-model")
	var seq int64
	testkit.WaitFor(t, "the next publisher's block in the index", func() bool {
		if err := pub.Send(zmq4.NewMsgFrom(topic, kvtest.BigEndian(seq), storedBatch(t, int(seq)+1))); err != nil {
			t.Fatal(err)
		}
		seq++
		v, ok := metricValue(t, tr, `vllm_router_kv_events_index_blocks{worker="`+w.URL()+`"}`)
		return ok && v >= 1
	})
}
