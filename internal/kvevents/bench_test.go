package kvevents

import (
	"runtime"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// benchBatch is a batch as an engine under agent traffic sends it: 32 events, each storing four
// 16-token blocks after a parent, or removing four.
func benchBatch(b *testing.B, maps bool) []byte {
	events := make([]any, 0, 32)
	for i := range 32 {
		if i%4 == 3 {
			events = append(events, wireRemoved{hashes: []any{i*10 + 1, i*10 + 2, i*10 + 3, i*10 + 4}, medium: "GPU"})
			continue
		}
		events = append(events, wireStored{hashes: []any{uint64(1<<62) + uint64(i), i*10 + 2, i*10 + 3, i*10 + 4}, parent: i*10 - 1,
			tokens: seq(i*64, 64), blockSize: 16, medium: "GPU"})
	}
	if maps {
		return encodeMaps(b, 0, events...)
	}
	return encodeArrays(b, 0, events...)
}

// BenchmarkDecode reports events decoded per second on one goroutine, in each encoding.
func BenchmarkDecode(b *testing.B) {
	for _, enc := range []struct {
		name string
		maps bool
	}{{"arrays", false}, {"maps", true}} {
		b.Run(enc.name, func(b *testing.B) {
			payload := benchBatch(b, enc.maps)
			dec := NewDecoder()
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			var events int
			for b.Loop() {
				batch, err := dec.Decode(payload)
				if err != nil {
					b.Fatal(err)
				}
				events += len(batch.Events)
			}
			b.ReportMetric(float64(events)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkIndexBytesPerBlock measures the heap one indexed block takes (the figure behind
// perBlockBytes) over a million blocks on 8 workers, and the cost of applying a store.
func BenchmarkIndexBytesPerBlock(b *testing.B) {
	const blocks = 1 << 20
	workers := []tenant.ID{"w0", "w1", "w2", "w3", "w4", "w5", "w6", "w7"}
	tokens := make([]uint32, 16)
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		x := NewIndex(1 << 40)
		for i := range blocks {
			tokens[0] = uint32(i)
			e := Event{Kind: Stored, BlockHashes: []Hash{Hash(i)}, Parent: Hash(i - 1), HasParent: i%64 != 0, TokenIDs: tokens, BlockSize: 16}
			x.Apply(workers[i/64%8], "m", Batch{Events: []Event{e}}) // chains of 64 blocks, one worker each
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		indexed := 0
		for _, w := range workers {
			indexed += x.Blocks(w)
		}
		if indexed != blocks {
			b.Fatalf("%d blocks indexed of %d", indexed, blocks)
		}
		b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/float64(indexed), "heap-bytes/block")
		b.ReportMetric(float64(x.Bytes())/float64(indexed), "counted-bytes/block")
		runtime.KeepAlive(x)
	}
}

// BenchmarkIndexBytesPerBlockAtTheBudget measures the heap one indexed block takes once the index
// is at its budget and evicting, as under a flood: a worker stores ten times what its budget of
// 2^18 blocks holds, in chains of four blocks, and the heap is read at eight points of the last
// two budgets' worth, over which the eviction order fills up and is compacted. It reports the
// largest and the mean.
func BenchmarkIndexBytesPerBlockAtTheBudget(b *testing.B) {
	const held = 1 << 18
	tokens := make([]uint32, 16)
	for b.Loop() {
		runtime.GC()
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		x := NewIndex(held * perBlockBytes)
		var most, sum float64
		for i := range 10 * held {
			tokens[0] = uint32(i)
			e := Event{Kind: Stored, BlockHashes: []Hash{Hash(i)}, Parent: Hash(i - 1), HasParent: i%4 != 0, TokenIDs: tokens, BlockSize: 16}
			x.Apply("w", "m", Batch{Events: []Event{e}})
			if i >= 8*held && (i+1)%(held/4) == 0 {
				runtime.GC()
				runtime.ReadMemStats(&after)
				perBlock := float64(after.HeapAlloc-before.HeapAlloc) / float64(x.Blocks("w"))
				most, sum = max(most, perBlock), sum+perBlock
			}
		}
		if x.Blocks("w") != held {
			b.Fatalf("%d blocks indexed, want the budget's %d", x.Blocks("w"), held)
		}
		b.ReportMetric(most, "max-heap-bytes/block")
		b.ReportMetric(sum/8, "mean-heap-bytes/block")
		runtime.KeepAlive(x)
	}
}

// BenchmarkMatch is one lookup of a 64-block request on a worker holding it.
func BenchmarkMatch(b *testing.B) {
	x := NewIndex(1 << 30)
	tokens := make([]uint32, 64*16)
	for i := range tokens {
		tokens[i] = uint32(i)
	}
	keys := Keys("m", "", "", tokens, 16)
	e := Event{Kind: Stored, BlockSize: 16, TokenIDs: tokens}
	for i := range keys {
		e.BlockHashes = append(e.BlockHashes, Hash(i+1))
	}
	x.Apply("w", "m", Batch{Events: []Event{e}})
	b.ReportAllocs()
	for b.Loop() {
		if m := x.Match("w", keys); m.Blocks != 64 {
			b.Fatal(m)
		}
	}
}

// BenchmarkKeys is the keys of a 1 MiB prompt's tokens (262,144 tokens, about four bytes of JSON
// each) in blocks of 16: what a request without a session id pays to be matched against the
// engines' events, and, per stored block, what applying an engine's events pays.
func BenchmarkKeys(b *testing.B) {
	tokens := u32(seq(0, 1<<18))
	b.SetBytes(int64(4 * len(tokens)))
	b.ReportAllocs()
	for b.Loop() {
		if k := Keys("m", "", "", tokens, 16); len(k) != len(tokens)/16 {
			b.Fatal(len(k))
		}
	}
}

// BenchmarkKeyMemoTurn is the keys of a turn of a 1 MiB prompt that appends 512 tokens to the
// earlier turn the memo remembers: what a turn of a long conversation pays (BenchmarkKeys is
// what it paid before the memo, and what a prompt the memo has not seen pays).
func BenchmarkKeyMemoTurn(b *testing.B) {
	tokens := u32(seq(0, 1<<18))
	earlier := tokens[:len(tokens)-512]
	b.SetBytes(int64(4 * len(tokens)))
	b.ReportAllocs()
	for b.Loop() {
		b.StopTimer()
		var m KeyMemo
		m.Keys("", "", earlier, 16)
		b.StartTimer()
		if k := m.Keys("", "", tokens, 16); len(k) != len(tokens)/16 {
			b.Fatal(len(k))
		}
	}
}
