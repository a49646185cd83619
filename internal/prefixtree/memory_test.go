package prefixtree

import (
	"math/rand/v2"
	"runtime"
	"strconv"
	"testing"
)

// Bounds the memory tests assert. heapOverhead covers what the tree holds outside the charge
// (the Tree struct and the tenant map's fixed part) and the measurement's noise.
const (
	heapPerBudget  = 1.25 // live heap ≤ 1.25 × budget + heapOverhead, after any Insert
	heapPerCharged = 1.05 // live heap ≤ 1.05 × Bytes() + heapOverhead: the charge is real
	heapOverhead   = 256 << 10
)

// insertCounterKeys inserts the keys "req 1" … "req n" round-robin over four tenants: the
// shortest keys a client can send, where each key costs a node for a byte or two of label.
func insertCounterKeys(tr *Tree, n int) {
	tenants := benchTenants[:4]
	for i := range n {
		tr.Insert(model, "req "+strconv.Itoa(i+1), tenants[i%len(tenants)])
	}
}

// fillHistories inserts growing conversations over eight tenants until volume bytes of new
// history have been sent, keeping only the conversations in flight so the generator's own
// memory stays small.
func fillHistories(tr *Tree, volume int) {
	gen := newHistoryGen(3, 4<<10, 200, 3000)
	rng := rand.New(rand.NewPCG(4, 5))
	active := make([]string, 64)
	activeTurns := make([]int, len(active))
	for sent := 0; sent < volume; {
		s := rng.IntN(len(active))
		if activeTurns[s] == 0 {
			active[s] = ""
			activeTurns[s] = 5 + rng.IntN(40) // a new conversation of 5..44 turns
		}
		prev := len(active[s])
		active[s] = gen.nextTurn(active[s])
		sent += len(active[s]) - prev
		activeTurns[s]--
		// Conversations stick to their worker, except one turn in eight lands on the next.
		worker := s
		if rng.IntN(8) == 0 {
			worker++
		}
		tr.Insert(model, active[s], benchTenants[worker%len(benchTenants)])
	}
}

// treeHeap builds a tree with the given budget, fills it with fill and returns it with the
// live heap it holds: the growth of HeapAlloc across the fill, each side measured after a
// full collection. The fill's own garbage is gone by then; labels are copies, so no key the
// fill made is kept alive by the tree.
func treeHeap(budget int, fill func(tr *Tree, budget int)) (*Tree, int) {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	tr := New(budget)
	fill(tr, budget)
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(tr)
	return tr, int(int64(after.HeapAlloc) - int64(before.HeapAlloc))
}

// storedKeys counts the nodes where an inserted key ends: the keys the tree still holds whole.
func storedKeys(tr *Tree) int {
	tr.mu.RLock()
	defer tr.mu.RUnlock()
	keys := 0
	for _, n := range allNodes(tr) {
		if n.keyEnd {
			keys++
		}
	}
	return keys
}

// assertHeapWithinBudget checks the budget against the memory it stands for: Bytes() within
// the 10% Insert slack, and the live heap the tree holds within heapPerBudget of the budget
// and within heapPerCharged of Bytes(). Every node charged at its label alone would break
// the last bound by the node's overhead.
func assertHeapWithinBudget(t *testing.T, tr *Tree, heap, budget int) {
	t.Helper()
	bytes := tr.Bytes()
	keys := storedKeys(tr)
	t.Logf("budget %d B: %d keys, %d chars, Bytes() %d, live heap %d B = %.1f B/key, %.3f B/char, %.3f × Bytes(), %.3f × budget",
		budget, keys, tr.Chars(), bytes, heap, float64(heap)/float64(keys), float64(heap)/float64(tr.Chars()),
		float64(heap)/float64(bytes), float64(heap)/float64(budget))
	if bytes > budget+budget/overBudgetSlack {
		t.Errorf("Bytes() = %d, over 1.1 × the budget %d", bytes, budget)
	}
	if raceEnabled {
		// Under the race detector the runtime gives every pointer-free object under 16
		// bytes a 16-byte block of its own, so the heap measured here is not the heap a
		// production build holds.
		t.Log("race detector on: live heap bounds not asserted")
		return
	}
	if limit := int(heapPerBudget*float64(budget)) + heapOverhead; heap > limit {
		t.Errorf("the tree holds %d B of heap, over %.2f × the budget %d + %d", heap, heapPerBudget, budget, heapOverhead)
	}
	if limit := int(heapPerCharged*float64(bytes)) + heapOverhead; heap > limit {
		t.Errorf("the tree holds %d B of heap but charges %d: the charge misses %.0f%% of it", heap, bytes, 100*(float64(heap)/float64(bytes)-1))
	}
}

// TestBudget_BoundsHeapForShortKeys stores 200,000 counter keys ("req 1", "req 2", …) under
// a 4 MiB budget. Each key is a node of over a hundred bytes for a byte or two of label, so a
// budget on label bytes would hold 7× its size here; a budget on heap bytes holds the tree to it.
func TestBudget_BoundsHeapForShortKeys(t *testing.T) {
	const budget, keys = 4 << 20, 200_000
	tr, heap := treeHeap(budget, func(tr *Tree, budget int) { insertCounterKeys(tr, keys) })
	// Without the heap figure (race mode), the charge must still count every whole key
	// held at no less than its node's struct.
	if held, charged := storedKeys(tr), tr.Bytes(); charged < held*nodeStructBytes {
		t.Errorf("%d keys held charge %d B, less than their %d B of nodes", held, charged, held*nodeStructBytes)
	}
	assertHeapWithinBudget(t, tr, heap, budget)
	checkInvariants(t, tr)
}

// TestBudget_BoundsHeapForGrowingHistories sends chat histories that grow turn by turn (a
// shared 4 KiB system prompt, turns of 200–3000 bytes, 64 conversations at a time over eight
// tenants) until three budgets' worth of history has gone through the tree: the same bounds
// hold as for short keys, and a stored byte of history costs little more than a byte.
func TestBudget_BoundsHeapForGrowingHistories(t *testing.T) {
	budget := 16 << 20
	if testing.Short() || raceEnabled {
		budget = 4 << 20
	}
	tr, heap := treeHeap(budget, func(tr *Tree, budget int) { fillHistories(tr, 3*budget) })
	assertHeapWithinBudget(t, tr, heap, budget)
	if perChar := float64(heap) / float64(tr.Chars()); perChar > 1.5 && !raceEnabled {
		t.Errorf("%.3f heap bytes per stored char of long histories, want <= 1.5", perChar)
	}
	checkInvariants(t, tr)
}
