package prefixtree

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

const (
	workerA = "http://10.0.0.1:8000"
	workerB = "http://10.0.0.2:8000"
	workerC = "http://10.0.0.3:8000"
)

// model is the namespace of the tests that need only one.
const model = "meta-llama/Llama-3.1-8B-Instruct"

func assertMatch(t *testing.T, tr *Tree, ns, key string, wantMatched int, wantHolders ...tenant.ID) {
	t.Helper()
	got := tr.Match(ns, key)
	if got.Matched != wantMatched || !slices.Equal(got.Holders, wantHolders) {
		t.Fatalf("Match(%q, %q) = {%d %q}, want {%d %q}", ns, key, got.Matched, got.Holders, wantMatched, wantHolders)
	}
}

// allNodes returns every node of the tree, namespace roots included.
func allNodes(tr *Tree) []*node {
	var stack, all []*node
	for _, root := range tr.spaces {
		stack = append(stack, root)
	}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = append(stack[:len(stack)-1], n.children...)
		all = append(all, n)
	}
	return all
}

func TestMatch_ExactKeyMatchesWholly(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "system|user: hi", workerA)
	assertMatch(t, tr, model, "system|user: hi", len("system|user: hi"), workerA)
	checkInvariants(t, tr)
}

func TestMatch_LongerKeyMatchesStoredPrefix(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "system|user: hi", workerA)
	assertMatch(t, tr, model, "system|user: hi|assistant: hello", len("system|user: hi"), workerA)
}

func TestMatch_PartialMatchStopsMidEdge(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "system|user: hi", workerA)
	assertMatch(t, tr, model, "system|user: bye", len("system|user: "), workerA)
}

func TestMatch_NoCommonPrefixIsAMiss(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "system|user: hi", workerA)
	assertMatch(t, tr, model, "other", 0)
	assertMatch(t, tr, model, "", 0)
	assertMatch(t, New(0), model, "anything", 0)
}

func TestMatch_HoldersListsEveryTenantAtTheDeepestPoint(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|turn1|turn2", workerA)
	tr.Insert(model, "sys|turn1", workerB)
	tr.Insert(model, "sys|turn1|turn2", workerC)
	tr.Insert(model, "sys|other", workerB)

	assertMatch(t, tr, model, "sys|turn1|turn2|turn3", len("sys|turn1|turn2"), workerA, workerC)
	// Past "sys|turn1" only A and C go on; the shared point is held by all three.
	assertMatch(t, tr, model, "sys|turn1|x", len("sys|turn1|"), workerA, workerC)
	assertMatch(t, tr, model, "sys|turn1", len("sys|turn1"), workerA, workerB, workerC)
	assertMatch(t, tr, model, "sys|o", len("sys|o"), workerB)
	checkInvariants(t, tr)
}

func TestInsert_DivergenceMidEdgeSplitsTheEdge(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "abcdef", workerA)
	tr.Insert(model, "abcxyz", workerB)

	if got, want := tr.Chars(), len("abc")+len("def")+len("xyz"); got != want {
		t.Fatalf("Chars() = %d, want %d", got, want)
	}
	if root := tr.spaces[model]; len(root.children) != 1 || root.children[0].label != "abc" {
		t.Fatalf("root should have the single child \"abc\", has %d children", len(root.children))
	}
	assertMatch(t, tr, model, "abcdef", 6, workerA)
	assertMatch(t, tr, model, "abcxyz", 6, workerB)
	assertMatch(t, tr, model, "abc", 3, workerA, workerB)
	assertMatch(t, tr, model, "abq", 2, workerA, workerB)
	checkInvariants(t, tr)
}

func TestInsert_KeyEndingMidEdgeSplitsTheEdge(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "abcdef", workerA)
	tr.Insert(model, "abc", workerB)
	if got := tr.Chars(); got != 6 {
		t.Fatalf("Chars() = %d, want 6", got)
	}
	assertMatch(t, tr, model, "abcdef", 6, workerA)
	assertMatch(t, tr, model, "abcd", 4, workerA)
	assertMatch(t, tr, model, "abc", 3, workerA, workerB)
	checkInvariants(t, tr)
}

func TestInsert_RepeatedKeyStoresNothingNew(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "abcdef", workerA)
	tr.Insert(model, "abcdef", workerA)
	tr.Insert(model, "abc", workerA)
	if got := tr.Chars(); got != 6 {
		t.Fatalf("Chars() = %d, want 6", got)
	}
	checkInvariants(t, tr)
}

func TestInsert_LabelsDoNotPinTheCallersKey(t *testing.T) {
	tr := New(0)
	body := "sys|user: hello|assistant: hi, a long request body follows"
	tr.Insert(model, body[:15], workerA) // a substring of a larger request
	tr.Insert(model, body[:4]+"x", workerB)
	tr.Insert(model, body[:9]+"y", workerC) // splits an existing edge
	tr.Insert(body[:3], body[4:9], workerA) // a namespace cut from the caller's bytes too

	start := uintptr(unsafe.Pointer(unsafe.StringData(body)))
	end := start + uintptr(len(body))
	for _, n := range allNodes(tr) {
		if n.label == "" {
			continue
		}
		if p := uintptr(unsafe.Pointer(unsafe.StringData(n.label))); p >= start && p < end {
			t.Fatalf("label %q points into the caller's key", n.label)
		}
	}
	checkInvariants(t, tr)
}

func TestMatchTenant_ReportsEachTenantsOwnPrefix(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|a1|a2|a3", workerA)
	tr.Insert(model, "sys|a1", workerB)
	tr.Insert(model, "sys|b1", workerC)

	key := "sys|a1|a2|a3|a4"
	for _, tc := range []struct {
		tenant tenant.ID
		want   int
	}{
		{workerA, len("sys|a1|a2|a3")},
		{workerB, len("sys|a1")},
		{workerC, len("sys|")},
		{"http://unknown:8000", 0},
	} {
		if got := tr.MatchTenant(model, key, tc.tenant); got != tc.want {
			t.Errorf("MatchTenant(%q, %q) = %d, want %d", key, tc.tenant, got, tc.want)
		}
	}
	if got := tr.MatchTenant(model, "sys|a1|zz", workerA); got != len("sys|a1|") {
		t.Errorf("MatchTenant mid-edge = %d, want %d", got, len("sys|a1|"))
	}
}

func TestRemoveTenant_PrunesNodesNobodyHoldsAndFreesTheirBytes(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|shared|a-only", workerA)
	tr.Insert(model, "sys|shared", workerB)
	chars, bytes := tr.Chars(), tr.Bytes()

	freed := tr.RemoveTenant(workerA)
	if got, want := tr.Chars(), chars-len("|a-only"); got != want {
		t.Fatalf("Chars() = %d after removing A, want %d", got, want)
	}
	// At least the pruned node's struct and label, and A's interned name.
	if min := nodeStructBytes + len("|a-only") + len(workerA); freed < min || tr.Bytes() != bytes-freed {
		t.Fatalf("RemoveTenant freed %d bytes (want >= %d), Bytes() went from %d to %d", freed, min, bytes, tr.Bytes())
	}
	if got := tr.MatchTenant(model, "sys|shared|a-only", workerA); got != 0 {
		t.Fatalf("removed tenant still matches %d bytes", got)
	}
	assertMatch(t, tr, model, "sys|shared|a-only", len("sys|shared"), workerB)
	checkInvariants(t, tr)

	bytes = tr.Bytes()
	if freed := tr.RemoveTenant(workerB); freed != bytes-tr.Bytes() || tr.Chars() != 0 || tr.nodeBytes != 0 {
		t.Fatalf("removing the last tenant freed %d, left %d chars, %d bytes charged to nodes", freed, tr.Chars(), tr.nodeBytes)
	}
	if freed := tr.RemoveTenant(workerB); freed != 0 {
		t.Fatalf("removing an unknown tenant freed %d", freed)
	}
	checkInvariants(t, tr)
}

func TestRemoveTenant_ReusedTenantIDStartsEmpty(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|a", workerA)
	tr.Insert(model, "sys|b", workerB)
	tr.RemoveTenant(workerA)
	tr.Insert(model, "sys|c", workerC) // takes A's freed id
	if got := tr.MatchTenant(model, "sys|a", workerC); got != len("sys|") {
		t.Fatalf("new tenant inherited the removed tenant's prefix: %d", got)
	}
	assertMatch(t, tr, model, "sys|c", 5, workerC)
	checkInvariants(t, tr)
}

func TestRemoveTenantsWithBase_RemovesWorkerAndItsRanksOnly(t *testing.T) {
	const url = "http://10.0.0.1:8000"
	tr := New(0)
	removed := []tenant.ID{url, url + "@0", url + "@1", url + "@12"}
	kept := []tenant.ID{url + "2", url + "x@0", url + "@", url + "@r1", "http://10.0.0.1:800"}
	for _, tenant := range append(slices.Clone(removed), kept...) {
		tr.Insert(model, "sys|"+string(tenant), tenant)
	}
	tr.RemoveTenantsWithBase(url)
	for _, tenant := range removed {
		if got := tr.MatchTenant(model, "sys|"+string(tenant), tenant); got != 0 {
			t.Errorf("%q should be removed, still holds %d bytes", tenant, got)
		}
	}
	for _, tenant := range kept {
		if got, want := tr.MatchTenant(model, "sys|"+string(tenant), tenant), len("sys|"+string(tenant)); got != want {
			t.Errorf("%q should be kept, holds %d bytes, want %d", tenant, got, want)
		}
	}
	checkInvariants(t, tr)
}

func TestEvict_LeastRecentlyInsertedLeavesGoFirst(t *testing.T) {
	tr := New(1 << 20)
	tr.Insert(model, "sys|old-session", workerA)
	tr.Insert(model, "sys|mid-session", workerB)
	tr.Insert(model, "sys|new-session", workerA)
	chars, bytes := tr.Chars(), tr.Bytes()
	tr.maxBytes = bytes - 1 // one leaf's worth of eviction

	freed := tr.Evict()
	if got, want := tr.Chars(), chars-len("old-session"); got != want {
		t.Fatalf("Chars() = %d after Evict, want %d", got, want)
	}
	if min := nodeStructBytes + len("old-session"); freed < min || tr.Bytes() != bytes-freed {
		t.Fatalf("Evict freed %d bytes (want >= %d), Bytes() went from %d to %d", freed, min, bytes, tr.Bytes())
	}
	assertMatch(t, tr, model, "sys|old-session", len("sys|"), workerA, workerB)
	assertMatch(t, tr, model, "sys|mid-session", len("sys|mid-session"), workerB)
	assertMatch(t, tr, model, "sys|new-session", len("sys|new-session"), workerA)
	checkInvariants(t, tr)
}

// evictOldest sets tr's budget one byte below its size and evicts: the oldest leaf goes.
func evictOldest(tr *Tree) int {
	tr.maxBytes = tr.Bytes() - 1
	return tr.Evict()
}

func TestEvict_ReinsertRefreshesALeaf(t *testing.T) {
	tr := New(1 << 20)
	tr.Insert(model, "sys|first", workerA)
	tr.Insert(model, "sys|second", workerB)
	tr.Insert(model, "sys|first", workerA) // used again: now "second" is the oldest
	evictOldest(tr)
	assertMatch(t, tr, model, "sys|first", len("sys|first"), workerA)
	assertMatch(t, tr, model, "sys|second", len("sys|"), workerA, workerB)
	checkInvariants(t, tr)
}

func TestEvict_MatchDoesNotRefreshALeaf(t *testing.T) {
	tr := New(1 << 20)
	tr.Insert(model, "sys|first", workerA)
	tr.Insert(model, "sys|second", workerB)
	tr.Match(model, "sys|first")
	tr.MatchTenant(model, "sys|first", workerA)
	evictOldest(tr)
	assertMatch(t, tr, model, "sys|first", len("sys|"), workerA, workerB)
}

func TestEvict_ExposedParentCompetesByItsOwnAge(t *testing.T) {
	tr := New(1 << 20)
	tr.Insert(model, "sys|s1|t1", workerA)
	tr.Insert(model, "sys|s1|t1|t2", workerA) // chain: sys|s1|t1 -> |t2
	tr.Insert(model, "sys|s2|t1", workerB)
	evictOldest(tr) // "|t2", the oldest leaf
	assertMatch(t, tr, model, "sys|s1|t1|t2", len("sys|s1|t1"), workerA)
	// Evicting "|t2" exposed "1|t1"; it is still older than session 2's leaf.
	evictOldest(tr)
	assertMatch(t, tr, model, "sys|s2|t1", len("sys|s2|t1"), workerB)
	assertMatch(t, tr, model, "sys|s1|t1|t2", len("sys|s"), workerA, workerB)
	checkInvariants(t, tr)
}

func TestEvict_WithinBudgetEvictsNothing(t *testing.T) {
	tr := New(1 << 10)
	tr.Insert(model, "sys|a", workerA)
	if freed := tr.Evict(); freed != 0 {
		t.Fatalf("Evict freed %d within budget", freed)
	}
	if freed := New(0).Evict(); freed != 0 {
		t.Fatalf("Evict without a budget freed %d", freed)
	}
}

// randomHistory returns a chat history for session s that is n turns long; histories of one
// session are prefixes of each other and all sessions share a system prompt.
func randomHistory(rng *rand.Rand, prev string, turnLen int) string {
	var b strings.Builder
	b.Grow(len(prev) + turnLen + 16)
	b.WriteString(prev)
	fmt.Fprintf(&b, "|turn%d:", rng.IntN(1000))
	for b.Len() < len(prev)+turnLen {
		b.WriteByte(byte('a' + rng.IntN(26)))
	}
	return b.String()
}

func TestBudget_HoldsUnderALongRandomInsertWorkload(t *testing.T) {
	const budget = 64 << 10
	tr := New(budget)
	rng := rand.New(rand.NewPCG(1, 2))
	system := randomHistory(rng, "system:", 2000)
	sessions := make([]string, 16)
	tenants := []tenant.ID{workerA, workerB, workerC, workerA + "@1"}
	for i := range 4000 {
		s := rng.IntN(len(sessions))
		if sessions[s] == "" || rng.IntN(20) == 0 {
			sessions[s] = system // a new conversation
		}
		sessions[s] = randomHistory(rng, sessions[s], 50+rng.IntN(800))
		tr.Insert(model, sessions[s], tenants[rng.IntN(len(tenants))])
		if got := tr.Bytes(); got > budget+budget/10 {
			t.Fatalf("insert %d: Bytes() = %d exceeds 1.1 x budget %d", i, got, budget)
		}
		if i%97 == 0 {
			tr.Evict()
			if got := tr.Bytes(); got > budget {
				t.Fatalf("insert %d: Bytes() = %d after Evict exceeds budget %d", i, got, budget)
			}
			checkInvariants(t, tr)
		}
	}
	checkInvariants(t, tr)
}

func TestBudget_KeyLargerThanTheBudgetIsEvicted(t *testing.T) {
	const budget = 1 << 10
	tr := New(budget)
	tr.Insert(model, strings.Repeat("x", 5*budget), workerA)
	if got := tr.Bytes(); got > budget || tr.Chars() != 0 {
		t.Fatalf("Bytes() = %d, Chars() = %d after one oversized insert", got, tr.Chars())
	}
	checkInvariants(t, tr)
}

func TestConcurrent_InsertMatchRemove(t *testing.T) {
	tr := New(32 << 10)
	tenants := []tenant.ID{workerA, workerA + "@0", workerA + "@1", workerB, workerC}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			ns := fmt.Sprintf("model-%d", g%2) // two goroutines per namespace
			rng := rand.New(rand.NewPCG(uint64(g), 7))
			history := "system prompt"
			for range 2000 {
				if rng.IntN(30) == 0 {
					history = "system prompt"
				}
				history = randomHistory(rng, history, 10+rng.IntN(200))
				tenant := tenants[rng.IntN(len(tenants))]
				switch rng.IntN(10) {
				case 0:
					tr.RemoveTenant(tenant)
				case 1:
					tr.RemoveTenantsWithBase(workerA)
				case 2:
					tr.Evict()
				case 3, 4:
					tr.Insert(ns, history, tenant)
				case 5:
					tr.MatchTenant(ns, history, tenant)
				default:
					m := tr.Match(ns, history)
					if m.Matched > 0 && len(m.Holders) == 0 {
						t.Errorf("match of %d bytes without holders", m.Matched)
					}
				}
			}
		})
	}
	wg.Wait()
	checkInvariants(t, tr)
}

func TestCommonPrefixLen(t *testing.T) {
	long := strings.Repeat("0123456789abcdef", 1000)
	for _, tc := range []struct {
		a, b string
		want int
	}{
		{"", "", 0},
		{"abc", "", 0},
		{"abc", "abd", 2},
		{"abc", "abcdef", 3},
		{long, long, len(long)},
		{long, long[:5000] + "X", 5000},
		{long[:4095] + "X", long, 4095},
		{long[:4096] + "X", long, 4096},
		{long[:300] + "X", long, 300},
		{long[:17] + "X", long, 17},
	} {
		if got := commonPrefixLen(tc.a, tc.b); got != tc.want {
			t.Errorf("commonPrefixLen(len %d, len %d) = %d, want %d", len(tc.a), len(tc.b), got, tc.want)
		}
	}
}
