package session

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync/atomic"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// sessionKey returns a 40-byte session key, the length of a typical hashed conversation id.
func sessionKey(i int) string { return fmt.Sprintf("session-%032x", i) }

var benchTenants = func() []tenant.ID {
	t := make([]tenant.ID, 8)
	for i := range t {
		t[i] = tenant.ID(fmt.Sprintf("http://10.0.0.%d:8000", i+1))
	}
	return t
}()

// sessionKeys returns the keys of sessions 0 to n-1, each sessionKey(i).
func sessionKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = sessionKey(i)
	}
	return keys
}

// fillSpread sets each of keys in m, key i in the model modelOf(i) on benchTenants[i%8]: the
// sessions a benchmark starts from, spread over the workers.
func fillSpread(m *Memory, keys []string, modelOf func(i int) string) {
	for i, k := range keys {
		_ = m.Set(ctx, modelOf(i), k, benchTenants[i%len(benchTenants)])
	}
}

// onlyModel is the modelOf of a store that holds one model's sessions.
func onlyModel(int) string { return model }

func BenchmarkGetHit(b *testing.B) {
	const n = 1 << 16
	m := NewMemory(MemoryOptions{})
	keys := sessionKeys(n)
	fillSpread(m, keys, onlyModel)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		if _, ok, _ := m.Get(ctx, model, keys[i%n]); !ok {
			b.Fatal("miss")
		}
		i++
	}
}

// BenchmarkSetNew adds new sessions to a full store, so every Set also evicts one.
func BenchmarkSetNew(b *testing.B) {
	const n = 1 << 16
	m := NewMemory(MemoryOptions{MaxEntries: n})
	keys := sessionKeys(2 * n)
	fillSpread(m, keys[:n], onlyModel)
	b.ReportAllocs()
	i := n
	for b.Loop() {
		_ = m.Set(ctx, model, keys[i%len(keys)], benchTenants[i%len(benchTenants)])
		i++
	}
}

// BenchmarkSetNewModels adds new sessions to a full store shared by 1 to 10 models, each key
// to a model drawn at random, so the store's least recently used entry is usually another
// model's: every Set reads each model's oldest entry, one lock at a time, and evicts the
// oldest of them.
func BenchmarkSetNewModels(b *testing.B) {
	const n = 1 << 16
	keys := sessionKeys(2 * n)
	for _, count := range []int{1, 2, 4, 10} {
		b.Run(fmt.Sprintf("models=%d", count), func(b *testing.B) {
			models := make([]string, count)
			for i := range models {
				models[i] = fmt.Sprintf("model-%d", i)
			}
			rng := rand.New(rand.NewPCG(1, uint64(count)))
			of := make([]string, len(keys)) // the model of each key
			for i := range of {
				of[i] = models[rng.IntN(count)]
			}
			m := NewMemory(MemoryOptions{MaxEntries: n})
			fillSpread(m, keys[:n], func(i int) string { return of[i] })
			b.ReportAllocs()
			i := n
			for b.Loop() {
				k := i % len(keys)
				_ = m.Set(ctx, of[k], keys[k], benchTenants[i%len(benchTenants)])
				i++
			}
		})
	}
}

// BenchmarkSetNewParallel adds new sessions to four models sharing a full store from
// parallel goroutines, one model each: every Set reads the shared total and evicts the
// store's least recently used entry, its own model's or another's.
func BenchmarkSetNewParallel(b *testing.B) {
	const n = 1 << 16
	models := []string{"m0", "m1", "m2", "m3"}
	m := NewMemory(MemoryOptions{MaxEntries: n})
	keys := sessionKeys(2 * n)
	fillSpread(m, keys[:n], func(i int) string { return models[i%len(models)] })
	var next atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		g := int(next.Add(1))
		mdl := models[g%len(models)]
		for i := n + g*4099; pb.Next(); i++ {
			_ = m.Set(ctx, mdl, keys[i%len(keys)], benchTenants[i%len(benchTenants)])
		}
	})
}

// BenchmarkSetOverwrite points existing sessions at another worker.
func BenchmarkSetOverwrite(b *testing.B) {
	const n = 1 << 16
	m := NewMemory(MemoryOptions{})
	keys := sessionKeys(n)
	for _, k := range keys {
		_ = m.Set(ctx, model, k, benchTenants[0])
	}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		_ = m.Set(ctx, model, keys[i%n], benchTenants[i%len(benchTenants)])
		i++
	}
}

// heapBytesPerEntry fills one model with n sessions of 40-byte keys over eight tenants and
// returns the live heap per entry, measured after a full collection with runtime.MemStats.
// Keys are built on the fly and dropped, so only the store's own copies are counted.
func heapBytesPerEntry(n int) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	m := NewMemory(MemoryOptions{MaxEntries: n})
	for i := range n {
		_ = m.Set(ctx, model, sessionKey(i), benchTenants[i%len(benchTenants)])
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if m.Len(model) != n {
		panic("store lost entries")
	}
	runtime.KeepAlive(m)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(n)
}

// TestMemoryPerEntry holds the map to its memory target of at most 200 heap bytes per
// entry at 1M entries with 40-byte keys (100k with -short or -race). Heap use is
// deterministic for a fixed workload, so the bound is asserted; the figure is logged.
func TestMemoryPerEntry(t *testing.T) {
	n := 1 << 20
	if testing.Short() || raceEnabled {
		n = 100_000
	}
	perEntry := heapBytesPerEntry(n)
	t.Logf("%.1f heap bytes per session entry at %d entries", perEntry, n)
	if perEntry > 200 {
		t.Fatalf("%.1f heap bytes per entry, want <= 200", perEntry)
	}
}

// BenchmarkMemoryPerEntry reports the heap bytes per entry at 1M entries; the map is filled
// once whatever b.N is, so only B/entry is reported.
func BenchmarkMemoryPerEntry(b *testing.B) {
	b.ReportMetric(heapBytesPerEntry(1<<20), "B/entry")
	b.ReportMetric(0, "ns/op")
}
