package sim

import (
	"bytes"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
)

// BenchmarkKVEventsEncode measures encoding one batch of 32 events, stores of 4 blocks of 16
// tokens alternating with removals of 4 blocks, in either encoding: what the sender and the
// replay socket pay per batch, off the engine's path.
func BenchmarkKVEventsEncode(b *testing.B) {
	events := make([]kvEvent, 32)
	for i := range events {
		hashes := []uint64{uint64(i)<<40 | 1, uint64(i)<<40 | 2, uint64(i)<<40 | 3, uint64(i)<<40 | 4}
		if i%2 == 1 {
			events[i] = kvEvent{kind: kvcache.Evicted, hashes: hashes}
			continue
		}
		tokens := make([]uint32, 64)
		for k := range tokens {
			tokens[k] = uint32(1<<31 | (i*64+k)*2654435761)
		}
		events[i] = kvEvent{kind: kvcache.Stored, hashes: hashes, parent: 7, hasParent: true, tokens: tokens}
	}
	for _, enc := range []string{KVEncodingArray, KVEncodingMap} {
		b.Run(enc, func(b *testing.B) {
			b.ReportAllocs()
			var n int
			for b.Loop() {
				n = len(encodeBatch(&pubBatch{ts: 1.5, events: events}, enc == KVEncodingMap, 16))
			}
			b.ReportMetric(float64(n)/float64(len(events)), "bytes/event")
			b.ReportMetric(float64(b.N*len(events))/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkWorkerChat4KiBPublishing is BenchmarkWorkerChat4KiB on a cache of 2,048 blocks, which
// the 64 prompts do not fit together, so blocks are stored and evicted all along: without
// publishing, and with the worker publishing its events on a loopback PUB socket. The pair is
// the engine-side cost of publishing; events/s is what a worker at full speed publishes.
func BenchmarkWorkerChat4KiBPublishing(b *testing.B) {
	for _, publish := range []bool{false, true} {
		b.Run(fmt.Sprintf("publish=%v", publish), func(b *testing.B) {
			cfg := testConfig()
			if publish {
				cfg = eventsConfig(b, KVEncodingArray)
				cfg.BlockSize = 16
			}
			cfg.KVCacheBlocks = 2048
			w := newWorker(b, cfg)
			bodies := benchBodies(64, false)
			b.ReportAllocs()
			before := w.KVEventStats()
			start := time.Now()
			for i := 0; b.Loop(); i++ {
				req := httptest.NewRequest("POST", "/v1/chat/completions", bytes.NewReader(bodies[i%len(bodies)]))
				rec := httptest.NewRecorder()
				w.ServeHTTP(rec, req)
				if rec.Code != 200 {
					b.Fatalf("status %d", rec.Code)
				}
			}
			elapsed := time.Since(start)
			reportRate(b, start)
			if publish {
				time.Sleep(2 * defaultInterval) // the last batch sealed
				st := w.KVEventStats()
				b.ReportMetric(float64(st.Events-before.Events)/elapsed.Seconds(), "events/s")
				b.ReportMetric(float64(st.Dropped-before.Dropped), "dropped")
			}
		})
	}
}
