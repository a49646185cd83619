package prefixtree

import (
	"reflect"
	"slices"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// treeView is what a caller can observe of a tree: its charge, its stored history and the
// answers to a set of lookups.
type treeView struct {
	bytes, chars int
	matches      []Match
	held         map[tenant.ID][]int
}

func viewOf(tr *Tree, ns string, probes []string, tenants ...tenant.ID) treeView {
	v := treeView{bytes: tr.Bytes(), chars: tr.Chars(), held: map[tenant.ID][]int{}}
	for _, p := range probes {
		v.matches = append(v.matches, tr.Match(ns, p))
		for _, tenant := range tenants {
			v.held[tenant] = append(v.held[tenant], tr.MatchTenant(ns, p, tenant))
		}
	}
	return v
}

// sendAndFail does what the router does for an attempt that fails: it reads what tenant held,
// teaches the tree that tenant holds key, then releases it. It returns the bytes Release freed
// and checks they are what Bytes lost.
func sendAndFail(t *testing.T, tr *Tree, ns, key string, tenant tenant.ID) int {
	t.Helper()
	held := tr.MatchTenant(ns, key, tenant)
	tr.Insert(ns, key, tenant)
	checkInvariants(t, tr)
	before := tr.Bytes()
	freed := tr.Release(ns, key, tenant, held)
	if freed != before-tr.Bytes() {
		t.Fatalf("Release freed %d, Bytes() fell by %d", freed, before-tr.Bytes())
	}
	checkInvariants(t, tr)
	if got := tr.MatchTenant(ns, key, tenant); got != held {
		t.Fatalf("after Release %s holds %d bytes of the key, held %d before", tenant, got, held)
	}
	return freed
}

func TestRelease_UndoesAnInsertExactly(t *testing.T) {
	const (
		turn1 = "sys|tools|user: fix the bug|"
		turn2 = turn1 + "assistant: done|user: and the tests|"
	)
	cases := []struct {
		name  string
		setup func(tr *Tree)
		key   string
	}{{
		name: "next turn of the tenant's own conversation",
		setup: func(tr *Tree) {
			tr.Insert(model, turn1, workerA)
			tr.Insert(model, "sys|tools|user: other task|", workerB)
		},
		key: turn2,
	}, {
		name: "turn of a conversation another tenant served, past the shared trunk",
		setup: func(tr *Tree) {
			tr.Insert(model, "sys|tools|user: other task|", workerA)
			tr.Insert(model, turn1, workerB)
		},
		key: turn2,
	}}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			tr := New(0)
			c.setup(tr)
			probes := []string{c.key, c.key + "more", turn1, turn2, "sys|tools|user: another|", "sys|"}
			before := viewOf(tr, model, probes, workerA, workerB)
			leaves := len(tr.leaves)

			if freed := sendAndFail(t, tr, model, c.key, workerA); freed <= 0 {
				t.Fatalf("Release freed %d bytes", freed)
			}
			if after := viewOf(tr, model, probes, workerA, workerB); !reflect.DeepEqual(after, before) {
				t.Fatalf("after Insert and Release:\n%+v\nbefore the Insert:\n%+v", after, before)
			}
			if len(tr.leaves) != leaves {
				t.Fatalf("%d leaves in the heap, %d before", len(tr.leaves), leaves)
			}
		})
	}
}

func TestRelease_KeepsOtherTenantsHolds(t *testing.T) {
	const key = "sys|user: hi|assistant: hello|user: next|"
	tr := New(0)
	tr.Insert(model, key, workerB)         // B served this turn before
	tr.Insert(model, key+"more|", workerC) // C holds it and more
	chars := tr.Chars()

	sendAndFail(t, tr, model, key, workerA)
	if got := tr.Chars(); got != chars {
		t.Fatalf("Chars() = %d, want %d: nodes other tenants hold were pruned", got, chars)
	}
	assertMatch(t, tr, model, key, len(key), workerB, workerC)
	m := tr.Match(model, key+"next|")
	if m.Whole != len(key) || !slices.Equal(m.WholeHolders, []tenant.ID{workerB, workerC}) {
		t.Fatalf("the key is no longer whole for B and C: whole %d by %v", m.Whole, m.WholeHolders)
	}
	if got := tr.MatchTenant(model, key+"more|", workerC); got != len(key+"more|") {
		t.Fatalf("C holds %d bytes of its key", got)
	}
}

func TestRelease_KeepsTheTenantsEarlierPrefix(t *testing.T) {
	const (
		turn1 = "sys|user: a|"
		turn2 = turn1 + "assistant: b|user: c|"
	)
	tr := New(0)
	tr.Insert(model, turn1, workerA)
	tr.Insert(model, "sys|user: zzz|", workerA) // another conversation through the same trunk

	sendAndFail(t, tr, model, turn2, workerA) // held = len(turn1), at a node boundary
	if got := tr.MatchTenant(model, turn2, workerA); got != len(turn1) {
		t.Fatalf("A holds %d bytes of the failed turn, want its earlier turn's %d", got, len(turn1))
	}
	m := tr.Match(model, turn2)
	if m.Whole != len(turn1) || !slices.Equal(m.WholeHolders, []tenant.ID{workerA}) {
		t.Fatalf("A's earlier turn is no longer whole: whole %d by %v", m.Whole, m.WholeHolders)
	}

	// A key that leaves what A held in the middle of a node: the Insert split it there, and
	// Release keeps both halves of A's own key.
	sendAndFail(t, tr, model, "sys|user: zzy|", workerA) // held = len("sys|user: zz")
	if got := tr.MatchTenant(model, "sys|user: zzz|", workerA); got != len("sys|user: zzz|") {
		t.Fatalf("A holds %d bytes of its other conversation", got)
	}
}

func TestRelease_OfAKeyHeldWholeDoesNothing(t *testing.T) {
	const key = "sys|user: a|assistant: b|"
	tr := New(0)
	tr.Insert(model, key, workerA)
	tr.Insert(model, key+"user: c|", workerB)
	probes := []string{key, key + "user: c|"}
	before := viewOf(tr, model, probes, workerA, workerB)

	// A retry of a turn A already holds: A held all of it before, so there is nothing to undo.
	for _, held := range []int{len(key), len(key) + 10} {
		if freed := tr.Release(model, key, workerA, held); freed != 0 {
			t.Fatalf("Release at %d freed %d", held, freed)
		}
		if after := viewOf(tr, model, probes, workerA, workerB); !reflect.DeepEqual(after, before) {
			t.Fatalf("Release at %d changed the tree:\n%+v\nwas\n%+v", held, after, before)
		}
	}
	checkInvariants(t, tr)
}

func TestRelease_FromZeroDropsTheNamespaceWithItsLastNode(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|a|", workerA)
	chars, nodeBytes := tr.Chars(), tr.nodeBytes

	sendAndFail(t, tr, "fresh-model", "sys|a|", workerA)
	if _, ok := tr.spaces["fresh-model"]; ok || len(tr.spaces) != 1 {
		t.Fatalf("%d namespaces kept", len(tr.spaces))
	}
	// Every node and the namespace are uncharged; only the leaf heap's array keeps the room
	// the Insert grew it by.
	if tr.Chars() != chars || tr.nodeBytes != nodeBytes {
		t.Fatalf("Chars() = %d, nodes charged %d bytes; before: %d, %d", tr.Chars(), tr.nodeBytes, chars, nodeBytes)
	}
	assertMatch(t, tr, model, "sys|a|", len("sys|a|"), workerA)
}

func TestRelease_StraddlingNodeKeepsItsHold(t *testing.T) {
	// A holds one node "sys|user: a|" from a turn that succeeded. Were it told that it held only
	// "sys|" of it, the node still begins before that byte: A keeps it, as holding is per node
	// and Insert would have split the node at byte 4 had A held only "sys|" before it.
	tr := New(0)
	tr.Insert(model, "sys|user: a|", workerA)
	if freed := tr.Release(model, "sys|user: a|", workerA, len("sys|")); freed != 0 {
		t.Fatalf("Release freed %d", freed)
	}
	if got := tr.MatchTenant(model, "sys|user: a|", workerA); got != len("sys|user: a|") {
		t.Fatalf("A holds %d bytes of its node", got)
	}
	// What lies in nodes past the straddling one goes.
	tr.Insert(model, "sys|user: a|assistant: b|", workerA)
	if freed := tr.Release(model, "sys|user: a|assistant: b|", workerA, len("sys|")); freed <= 0 {
		t.Fatalf("Release freed %d", freed)
	}
	if got := tr.MatchTenant(model, "sys|user: a|assistant: b|", workerA); got != len("sys|user: a|") {
		t.Fatalf("A holds %d bytes, want the straddling node's %d", got, len("sys|user: a|"))
	}
	checkInvariants(t, tr)
}

func TestRelease_AlsoDropsTheTenantsOtherKeysPastHeld(t *testing.T) {
	// The tree is a prediction: a key sent to the same tenant through the released path, past
	// the byte it held, goes with it. Here the two branches share "|t2" below A's first turn.
	const turn1 = "sys|t1"
	tr := New(0)
	tr.Insert(model, turn1, workerA)
	held := tr.MatchTenant(model, turn1+"|t2a", workerA)
	tr.Insert(model, turn1+"|t2a", workerA)
	tr.Insert(model, turn1+"|t2b", workerA) // succeeded, in between
	tr.Insert(model, turn1+"|t2b", workerB)
	tr.Release(model, turn1+"|t2a", workerA, held)
	checkInvariants(t, tr)
	if got := tr.MatchTenant(model, turn1+"|t2b", workerA); got != len(turn1) {
		t.Fatalf("A holds %d bytes of its other key, want %d", got, len(turn1))
	}
	assertMatch(t, tr, model, turn1+"|t2b", len(turn1+"|t2b"), workerB)
	assertMatch(t, tr, model, turn1+"|t2a", len(turn1+"|t2"), workerB)
}

func TestRelease_UnknownTenantOrNamespaceFreesNothing(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|a|", workerA)
	if freed := tr.Release(model, "sys|a|", workerB, 0); freed != 0 {
		t.Fatalf("releasing an unknown tenant freed %d", freed)
	}
	if freed := tr.Release("no-such-model", "sys|a|", workerA, 0); freed != 0 {
		t.Fatalf("releasing in an unknown namespace freed %d", freed)
	}
	if freed := tr.Release(model, "zzz", workerA, 0); freed != 0 {
		t.Fatalf("releasing a key A never held freed %d", freed)
	}
	assertMatch(t, tr, model, "sys|a|", len("sys|a|"), workerA)
	checkInvariants(t, tr)
}

func TestRelease_LeavesTheLeafHeapReadyForEviction(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|old|", workerA)
	tr.Insert(model, "sys|new|", workerB)
	sendAndFail(t, tr, model, "sys|old|more|", workerA) // refreshes "sys|old|", then releases the tail
	// The exposed "sys|old|" is a leaf again and, refreshed by the Insert, now the newest.
	evictOldest(tr)
	checkInvariants(t, tr)
	if got := tr.MatchTenant(model, "sys|new|", workerB); got != len("sys|") {
		t.Fatalf("B holds %d bytes of the older leaf, which should have gone first", got)
	}
	assertMatch(t, tr, model, "sys|old|", len("sys|old|"), workerA)
}
