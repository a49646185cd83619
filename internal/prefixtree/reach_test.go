package prefixtree

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

func TestEvicted_HidesTheTenantsHoldsThatOld(t *testing.T) {
	const (
		old    = "sys|user: summarise the report|assistant: sure|"
		recent = "sys|user: write the tests|"
	)
	tr := New(0)
	tr.Insert(model, old, workerA)
	tr.Insert(model, recent, workerA)
	tr.Insert(model, old, workerB) // B uses the old conversation later: the node is fresh, A's hold is not

	held, age := tr.MatchTenantAt(model, old, workerA)
	// Its age: the bytes given since (recent) plus its end's offset in its key.
	if want := uint64(len(recent) + len(old)); held != len(old) || age != want {
		t.Fatalf("MatchTenantAt = %d, %d; want %d held, %d old", held, age, len(old), want)
	}
	tr.Evicted(workerA, age) // A's cache reported it evicted the old conversation
	checkInvariants(t, tr)

	if got := tr.MatchTenant(model, old, workerA); got != len("sys|user: ") {
		t.Errorf("A still counts %d bytes of the evicted conversation, want only the prefix it used since (%d)", got, len("sys|user: "))
	}
	if got := tr.MatchTenant(model, recent, workerA); got != len(recent) {
		t.Errorf("A holds %d bytes of the conversation it used after, want all %d", got, len(recent))
	}
	if m := tr.Match(model, old); m.Matched != len(old) || !slices.Equal(m.Holders, []tenant.ID{workerB}) || !slices.Equal(m.WholeHolders, []tenant.ID{workerB}) {
		t.Errorf("Match = %+v; want the old conversation held by B alone", m)
	}
	if _, taught := tr.Matches(model, old); taught.Matched != len(old) || !slices.Equal(taught.WholeHolders, []tenant.ID{workerA, workerB}) {
		t.Errorf("taught match = %+v; want the old conversation taught to A and B", taught)
	}
}

// The horizon learned from one eviction keeps applying: holds age as the tenant is taught new
// text, and stop counting once they are as old as what it evicted.
func TestInsert_ATailAgesAheadOfItsHead(t *testing.T) {
	tr := New(0)
	key := "system prompt|" + strings.Repeat("turn|", 20)
	tr.Insert(model, "system prompt|", workerB) // a node boundary after the prompt
	tr.Insert(model, key, workerA)
	_, headAge := tr.MatchTenantAt(model, "system prompt|", workerA)
	_, tailAge := tr.MatchTenantAt(model, key, workerA)
	if headAge != uint64(len("system prompt|")) || tailAge != uint64(len(key)) {
		t.Fatalf("ages: head %d, tail %d; want each its end's offset, %d and %d", headAge, tailAge, len("system prompt|"), len(key))
	}
	tr.Evicted(workerA, 40) // the cache kept the head, lost the tail (one node: a hold is whole nodes)
	if got := tr.MatchTenant(model, key, workerA); got != len("system prompt|") {
		t.Fatalf("after losing the tail A counts %d bytes, want the head's %d", got, len("system prompt|"))
	}
}

// The horizon learned from one eviction keeps applying: holds age as the tenant is taught new
// text, and stop counting once they are as old as what it evicted.
func TestEvicted_LaterHoldsStopCountingAtTheSameAge(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "a|"+strings.Repeat("x", 100), workerA)
	tr.Insert(model, "b|"+strings.Repeat("y", 100), workerA)
	_, age := tr.MatchTenantAt(model, "a|"+strings.Repeat("x", 100), workerA)
	tr.Evicted(workerA, age) // horizon: 102 bytes taught since a, plus a's 102 bytes
	if r := tr.ReachOf(workerA); r.Horizon != 204 {
		t.Fatalf("reach %+v, want horizon 204", r)
	}
	tr.Insert(model, "c|"+strings.Repeat("z", 60), workerA)
	if got := tr.MatchTenant(model, "b|"+strings.Repeat("y", 100), workerA); got != 102 {
		t.Fatalf("b, 62 + 102 bytes old, counts %d bytes, want all 102", got)
	}
	tr.Insert(model, "d|"+strings.Repeat("w", 60), workerA)
	if got := tr.MatchTenant(model, "b|"+strings.Repeat("y", 100), workerA); got != 0 {
		t.Fatalf("b, 124 + 102 bytes old, counts %d bytes beyond the horizon, want 0", got)
	}
	if got := tr.MatchTenant(model, "d|"+strings.Repeat("w", 60), workerA); got != 62 {
		t.Fatalf("d, just taught, counts %d bytes, want 62", got)
	}
}

func TestEvicted_ANewInsertCountsTheHoldAgain(t *testing.T) {
	const key = "sys|user: hello|"
	tr := New(0)
	tr.Insert(model, key, workerA)
	tr.Insert(model, "other|", workerA)
	_, age := tr.MatchTenantAt(model, key, workerA)
	tr.Evicted(workerA, age)
	if m := tr.Match(model, key); m.Matched != 0 {
		t.Fatalf("Match after Evicted = %+v, want nothing", m)
	}
	tr.Insert(model, key, workerA) // A prefilled it again
	if got := tr.MatchTenant(model, key, workerA); got != len(key) {
		t.Errorf("A holds %d bytes after the new Insert, want %d", got, len(key))
	}
}

func TestKept_GrowsTheHorizon(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "a|"+strings.Repeat("x", 100), workerA)
	tr.Insert(model, "b|"+strings.Repeat("y", 100), workerA)
	_, age := tr.MatchTenantAt(model, "a|"+strings.Repeat("x", 100), workerA)
	tr.Evicted(workerA, age)
	tr.Kept(workerA)
	if r := tr.ReachOf(workerA); r.Horizon != 204+204/4 {
		t.Fatalf("reach after Kept %+v, want horizon %d", r, 204+204/4)
	}
	tr.Kept(workerB) // unknown or unbounded tenants stay unbounded
	if r := tr.ReachOf(workerB); r.Horizon != 0 {
		t.Fatalf("reach of a tenant without a horizon after Kept: %+v", r)
	}
}

func TestEvicted_ARemovedTenantsIDStartsUnbounded(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|a|", workerA)
	tr.Insert(model, "sys|z|", workerA)
	_, age := tr.MatchTenantAt(model, "sys|a|", workerA)
	tr.Evicted(workerA, age)
	tr.RemoveTenant(workerA)
	tr.Insert(model, "sys|b|", workerB) // takes A's freed id
	if got := tr.MatchTenant(model, "sys|b|", workerB); got != len("sys|b|") {
		t.Errorf("the tenant reusing a bounded id holds %d bytes, want %d", got, len("sys|b|"))
	}
	if tr.bounded != 0 {
		t.Errorf("bounded = %d after the bounded tenant left, want 0", tr.bounded)
	}
}

// randomTurnWords are the pieces randomTurnsKey builds keys of: few, so that random keys share
// long prefixes and diverge at every depth, as conversations do.
var randomTurnWords = []string{"sys|", "tools|", "user: a|", "user: b|", "assistant: c|", "user: d|"}

// randomTurnsKey returns a key of 1 to most of randomTurnWords, drawn by rng with repeats.
func randomTurnsKey(rng *rand.Rand, most int) string {
	s := ""
	for range 1 + rng.IntN(most) {
		s += randomTurnWords[rng.IntN(len(randomTurnWords))]
	}
	return s
}

// Holdings must agree with MatchTenant for every tenant, holds beyond a horizon included.
func TestHoldings_AgreesWithMatchTenantForEveryTenant(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 13))
	tenants := []tenant.ID{workerA, workerB, workerC}
	key := func() string { return randomTurnsKey(rng, 6) }
	tr := New(0)
	var keys []string
	for i := range 400 {
		k, who := key(), tenants[rng.IntN(len(tenants))]
		tr.Insert(model, k, who)
		keys = append(keys, k)
		if i%37 == 0 {
			_, age := tr.MatchTenantAt(model, keys[rng.IntN(len(keys))], who)
			tr.Evicted(who, age)
		}
		probe := key()
		got := map[tenant.ID]int{}
		for _, h := range tr.Holdings(model, probe, nil) {
			if _, dup := got[h.Tenant]; dup || h.Held == 0 {
				t.Fatalf("Holdings(%q) lists %s twice or with 0 bytes", probe, h.Tenant)
			}
			got[h.Tenant] = h.Held
		}
		for _, tenant := range tenants {
			if want := tr.MatchTenant(model, probe, tenant); got[tenant] != want {
				t.Fatalf("step %d: Holdings(%q)[%s] = %d, MatchTenant = %d", i, probe, tenant, got[tenant], want)
			}
		}
		if m := tr.Match(model, probe); m.Matched != maxHeld(got) {
			t.Fatalf("step %d: Match(%q).Matched = %d, the longest holding is %d", i, probe, m.Matched, maxHeld(got))
		}
	}
	checkInvariants(t, tr)
}

func maxHeld(h map[tenant.ID]int) int {
	best := 0
	for _, n := range h {
		best = max(best, n)
	}
	return best
}

func BenchmarkHoldings(b *testing.B) {
	for _, tenants := range []int{4, 64} {
		b.Run(fmt.Sprintf("tenants=%d", tenants), func(b *testing.B) {
			tr := New(0)
			shared := "system prompt and tools|" + string(make([]byte, 4096))
			for i := range tenants * 8 {
				tr.Insert(model, fmt.Sprintf("%sconversation %d|%s", shared, i, string(make([]byte, 2048))), tenant.ID(fmt.Sprintf("http://10.0.0.%d:8000", i%tenants)))
			}
			key := fmt.Sprintf("%sconversation %d|%s|next turn", shared, 3, string(make([]byte, 2048)))
			dst := make([]Holding, 0, tenants)
			b.ReportAllocs()
			for b.Loop() {
				dst = tr.Holdings(model, key, dst[:0])
			}
		})
	}
}
