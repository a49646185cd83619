package prefixtree

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

func TestNamespaces_IdenticalKeysInDifferentNamespacesNeverMatch(t *testing.T) {
	const key = "sys|user: hi"
	tr := New(0)
	tr.Insert("model-a", key, workerA)
	tr.Insert("model-b", key, workerB)

	assertMatch(t, tr, "model-a", key+"|more", len(key), workerA)
	assertMatch(t, tr, "model-b", key+"|more", len(key), workerB)
	assertMatch(t, tr, "model-c", key, 0)
	if got := tr.MatchTenant("model-a", key, workerB); got != 0 {
		t.Fatalf("B holds %d bytes of model-a's key, all of them in model-b", got)
	}
	if m := tr.Match("model-b", key+"|more"); m.Whole != len(key) || !slices.Equal(m.WholeHolders, []tenant.ID{workerB}) || m.Branch != 0 {
		t.Fatalf("model-b sees model-a's copy of the key: %+v", m)
	}
	// Each namespace stores its own copy; the names count in no length.
	if got := tr.Chars(); got != 2*len(key) {
		t.Fatalf("Chars() = %d, want %d", got, 2*len(key))
	}
	checkInvariants(t, tr)
}

func TestNamespaces_NameJoinedToKeyIsNotAKey(t *testing.T) {
	// Were a namespace a prefix of its keys, ("a", "bc"), ("ab", "c") and ("", "abc") would
	// all be the key "abc".
	tr := New(0)
	tr.Insert("a", "bc", workerA)
	assertMatch(t, tr, "ab", "c", 0)
	assertMatch(t, tr, "", "abc", 0)
	assertMatch(t, tr, "a", "bc", 2, workerA)
	tr.Insert("", "abc", workerB)
	assertMatch(t, tr, "", "abc", 3, workerB)
	assertMatch(t, tr, "a", "bc", 2, workerA)
	checkInvariants(t, tr)
}

func TestNamespaces_OneBudgetBoundsAllNamespacesTogether(t *testing.T) {
	const budget, spaces = 256 << 10, 2000
	tr := New(budget)
	rng := rand.New(rand.NewPCG(3, 4))
	tenants := []tenant.ID{workerA, workerB, workerC}
	sent := 0
	for i := range spaces {
		ns := fmt.Sprintf("model-%d", i)
		history := "system:"
		for range 3 { // a short conversation per model
			history = randomHistory(rng, history, 100+rng.IntN(400))
			tr.Insert(ns, history, tenants[rng.IntN(len(tenants))])
			if got := tr.Bytes(); got > budget+budget/overBudgetSlack {
				t.Fatalf("model %d: Bytes() = %d exceeds 1.1 × budget %d", i, got, budget)
			}
		}
		sent += len(history)
		if i%101 == 0 {
			tr.Evict()
			if got := tr.Bytes(); got > budget {
				t.Fatalf("model %d: Bytes() = %d after Evict exceeds budget %d", i, got, budget)
			}
			checkInvariants(t, tr)
		}
	}
	if sent < 4*budget {
		t.Fatalf("sent only %d bytes of history for a %d-byte budget", sent, budget)
	}
	// The oldest models' namespaces went with their last leaves; the newest is still there.
	if n := len(tr.spaces); n >= spaces || n == 0 || tr.spaces[fmt.Sprintf("model-%d", spaces-1)] == nil {
		t.Fatalf("%d of %d namespaces kept, newest kept: %v", n, spaces, tr.spaces[fmt.Sprintf("model-%d", spaces-1)] != nil)
	}
	checkInvariants(t, tr)
}

func TestNamespaces_EvictingTheLastLeafDropsTheNamespace(t *testing.T) {
	tr := New(1 << 20)
	tr.Insert("old-model", "sys|a", workerA)
	tr.Insert("old-model", "sys|b", workerA) // old-model: "sys|" with the leaves "a" and "b"
	tr.Insert("new-model", "sys|c", workerB)

	// One leaf at a time, oldest first: "a", "b", then "sys|", exposed by the two.
	for _, gone := range []string{"sys|a", "sys|b"} {
		evictOldest(tr)
		if tr.spaces["old-model"] == nil || tr.MatchTenant("old-model", gone, workerA) != len("sys|") {
			t.Fatalf("evicting %q: old-model dropped, or the wrong leaf went", gone)
		}
		checkInvariants(t, tr)
	}
	root := tr.spaces["old-model"]
	// The last leaf, and with it the root (its struct, name and edge arrays) and map entry.
	want := root.children[0].heapBytes() + root.heapBytes() + spaceEntryBytes
	if freed := evictOldest(tr); freed != want {
		t.Fatalf("evicting old-model's last leaf freed %d bytes, want %d", freed, want)
	}
	if tr.spaces["old-model"] != nil || len(tr.spaces) != 1 {
		t.Fatalf("evicting old-model's last leaf kept the namespace: %d namespaces", len(tr.spaces))
	}
	if tr.Chars() != len("sys|c") {
		t.Fatalf("Chars() = %d after evicting old-model, want %d", tr.Chars(), len("sys|c"))
	}
	assertMatch(t, tr, "old-model", "sys|a", 0)
	assertMatch(t, tr, "new-model", "sys|c", len("sys|c"), workerB)
	checkInvariants(t, tr)

	// Evicting everything leaves nothing charged to nodes: the roots and their map entries
	// went with their namespaces.
	tr.maxBytes = 1
	tr.Evict()
	if len(tr.spaces) != 0 || tr.nodeBytes != 0 || tr.Chars() != 0 {
		t.Fatalf("after evicting everything: %d namespaces, %d bytes charged to nodes, %d chars", len(tr.spaces), tr.nodeBytes, tr.Chars())
	}
	checkInvariants(t, tr)
}

func TestNamespaces_NamespaceIsChargedItsRootAndMapEntry(t *testing.T) {
	tr := New(0)
	tr.Insert("model-a", "sys|a", workerA)
	before := tr.Bytes()
	ns := "a-model-with-a-long-name/Llama-3.1-70B-Instruct"
	tr.Insert(ns, "sys|a", workerA) // the same key and tenant: only the namespace is new
	leaf := tr.spaces[ns].children[0]
	want := allocBytes(nodeStructBytes) + allocBytes(len(ns)) + tr.spaces[ns].sliceBytes() + spaceEntryBytes + leaf.heapBytes()
	if got := tr.Bytes() - before; got < want {
		t.Fatalf("a new namespace costs %d bytes, want at least %d (root, name, map entry, leaf)", got, want)
	}
	checkInvariants(t, tr)
}

func TestNamespaces_RemovingATenantClearsItInEveryNamespace(t *testing.T) {
	tr := New(0)
	for _, ns := range []string{"model-a", "model-b", "model-c"} {
		tr.Insert(ns, "sys|"+ns, workerA)
		tr.Insert(ns, "sys|"+ns, workerA+"@1")
	}
	tr.Insert("model-b", "sys|shared", workerB)

	tr.RemoveTenant(workerA)
	for _, ns := range []string{"model-a", "model-b", "model-c"} {
		if got := tr.MatchTenant(ns, "sys|"+ns, workerA); got != 0 {
			t.Errorf("%s: removed tenant still holds %d bytes", ns, got)
		}
		if got := tr.MatchTenant(ns, "sys|"+ns, workerA+"@1"); got != len("sys|"+ns) {
			t.Errorf("%s: another rank of the worker lost its keys: holds %d bytes", ns, got)
		}
	}
	checkInvariants(t, tr)

	tr.RemoveTenantsWithBase(workerA)
	if len(tr.spaces) != 1 || tr.spaces["model-b"] == nil {
		t.Fatalf("namespaces emptied by the removal were kept: %d namespaces", len(tr.spaces))
	}
	assertMatch(t, tr, "model-b", "sys|model-b", len("sys|"), workerB)
	checkInvariants(t, tr)

	tr.RemoveTenant(workerB)
	if len(tr.spaces) != 0 || tr.nodeBytes != 0 {
		t.Fatalf("after removing every tenant: %d namespaces, %d bytes charged to nodes", len(tr.spaces), tr.nodeBytes)
	}
	checkInvariants(t, tr)
}

// TestNamespaces_DroppedNamespacesGiveTheirMemoryBack fills 20,000 namespaces and then
// empties them all. A Go map keeps its table at its largest size when entries are deleted, so
// without the rebuild the tree would go on holding about 900 KB of map table for namespaces
// it no longer has.
func TestNamespaces_DroppedNamespacesGiveTheirMemoryBack(t *testing.T) {
	const spaces = 20_000
	peak := 0
	tr, heap := treeHeap(0, func(tr *Tree, _ int) {
		for i := range spaces {
			tr.Insert(fmt.Sprintf("model-%d", i), "sys|hi", workerA)
		}
		peak = tr.Bytes()
		tr.RemoveTenant(workerA)
	})
	t.Logf("%d namespaces charged %d B; after removing their only tenant the tree holds %d B of heap", spaces, peak, heap)
	if len(tr.spaces) != 0 || tr.nodeBytes != 0 {
		t.Fatalf("after removing the only tenant: %d namespaces, %d bytes charged to nodes", len(tr.spaces), tr.nodeBytes)
	}
	// What is left charged is the leaf heap's array, kept at its capacity like any slice.
	if limit := tr.Bytes() + heapOverhead; !raceEnabled && heap > limit {
		t.Errorf("an emptied tree holds %d B of heap, over Bytes() %d + %d", heap, tr.Bytes(), heapOverhead)
	}
	checkInvariants(t, tr)
}
