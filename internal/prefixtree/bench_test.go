package prefixtree

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// historyGen produces chat histories the way agent workloads send them: one system prompt
// shared by every conversation, and per conversation a history that grows by one turn of
// turnMin..turnMax bytes at a time, so each key extends the previous key of its session.
type historyGen struct {
	rng              *rand.Rand
	system           string
	turnMin, turnMax int
	buf              []byte
}

func newHistoryGen(seed uint64, systemLen, turnMin, turnMax int) *historyGen {
	g := &historyGen{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), turnMin: turnMin, turnMax: turnMax}
	g.system = string(g.appendText(nil, systemLen))
	return g
}

// appendText appends n bytes of word-like text.
func (g *historyGen) appendText(b []byte, n int) []byte {
	end := len(b) + n
	for len(b) < end {
		if g.rng.IntN(6) == 0 {
			b = append(b, ' ')
		} else {
			b = append(b, byte('a'+g.rng.IntN(26)))
		}
	}
	return b
}

// nextTurn returns history extended by one turn.
func (g *historyGen) nextTurn(history string) string {
	if history == "" {
		history = g.system
	}
	g.buf = append(g.buf[:0], history...)
	g.buf = fmt.Appendf(g.buf, `,{"role":"user","content":"`)
	g.buf = g.appendText(g.buf, g.turnMin+g.rng.IntN(g.turnMax-g.turnMin+1))
	g.buf = append(g.buf, `"}`...)
	return string(g.buf)
}

// history returns a fresh conversation at least n bytes long.
func (g *historyGen) history(n int) string {
	h := ""
	for len(h) < n {
		h = g.nextTurn(h)
	}
	return h
}

var benchTenants = func() []tenant.ID {
	t := make([]tenant.ID, 8)
	for i := range t {
		t[i] = tenant.ID(fmt.Sprintf("http://10.0.0.%d:8000", i+1))
	}
	return t
}()

// BenchmarkInsertMatch measures one routing step on a growing conversation: Probe the new
// history, as cache_aware does, then Insert it, where everything but the newest turn is already in the tree.
// Sixteen conversations over eight tenants share a system prompt; each operation advances one
// conversation by one turn, so keys run from the named size to a few turns past it.
func BenchmarkInsertMatch(b *testing.B) {
	for _, size := range []struct {
		name      string
		bytes     int
		turnBytes int
	}{
		{"4KiB", 4 << 10, 512},
		{"64KiB", 64 << 10, 2 << 10},
		{"512KiB", 512 << 10, 12 << 10},
	} {
		b.Run(size.name, func(b *testing.B) {
			const sessions, turnsPerSession = 16, 8
			gen := newHistoryGen(1, 2<<10, size.turnBytes, size.turnBytes)
			// Every conversation's full future history, cut at turn boundaries.
			turns := make([][]string, sessions)
			for s := range turns {
				h := gen.history(size.bytes - size.turnBytes)
				turns[s] = []string{h}
				for range turnsPerSession {
					h = gen.nextTurn(h)
					turns[s] = append(turns[s], h)
				}
			}
			var tr *Tree
			step := 0
			var p Probe
			reset := func() {
				tr = New(0)
				for s := range turns {
					tr.Insert(model, turns[s][0], benchTenants[s%len(benchTenants)])
				}
				step = 0
			}
			reset()
			b.ReportAllocs()
			b.SetBytes(int64(size.bytes))
			b.ResetTimer()
			for range b.N {
				if step == sessions*turnsPerSession {
					b.StopTimer()
					reset()
					b.StartTimer()
				}
				s, turn := step%sessions, 1+step/sessions
				key := turns[s][turn]
				tenant := benchTenants[s%len(benchTenants)]
				if tr.Probe(&p, model, key, nil); p.Matched < len(turns[s][turn-1]) {
					b.Fatalf("matched %d of %d bytes already routed", p.Matched, len(turns[s][turn-1]))
				}
				tr.Insert(model, key, tenant)
				step++
			}
		})
	}
}

// BenchmarkMatchOnly512KiB is the read path (Probe) alone on a 512 KiB key whose first 500 KiB are stored.
func BenchmarkMatchOnly512KiB(b *testing.B) {
	gen := newHistoryGen(2, 2<<10, 12<<10, 12<<10)
	stored := gen.history(500 << 10)
	key := gen.nextTurn(stored)
	tr := New(0)
	for i, tenant := range benchTenants {
		tr.Insert(model, gen.history(500<<10), tenant)
		if i == 0 {
			tr.Insert(model, stored, tenant)
		}
	}
	b.ReportAllocs()
	b.SetBytes(int64(len(key)))
	var p Probe
	for b.Loop() {
		tr.Probe(&p, model, key, nil)
	}
}

// BenchmarkMemory reports the live heap a tree at its budget holds, per stored key, per
// stored byte of key (char) and per byte Bytes charges, for counter-like short keys and for
// growing chat histories. A tree is filled once whatever b.N is, so only these are reported.
func BenchmarkMemory(b *testing.B) {
	for _, w := range []struct {
		name   string
		budget int
		fill   func(*Tree, int)
	}{
		{"short_keys", 4 << 20, func(tr *Tree, budget int) { insertCounterKeys(tr, 200_000) }},
		{"long_histories", 64 << 20, func(tr *Tree, budget int) { fillHistories(tr, 3*budget) }},
	} {
		b.Run(w.name, func(b *testing.B) {
			tr, heap := treeHeap(w.budget, w.fill)
			keys := storedKeys(tr)
			b.ReportMetric(float64(heap)/float64(keys), "heapB/key")
			b.ReportMetric(float64(heap)/float64(tr.Chars()), "heapB/char")
			b.ReportMetric(float64(heap)/float64(tr.Bytes()), "heapB/chargedB")
			b.ReportMetric(float64(heap)/float64(w.budget), "heapB/budgetB")
			b.ReportMetric(0, "ns/op")
		})
	}
}
