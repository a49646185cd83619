package prefixtree

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

func TestForget_HidesTheTenantsHoldsUsedUpToTheMark(t *testing.T) {
	const (
		old    = "sys|user: summarise the report|assistant: sure|"
		recent = "sys|user: write the tests|"
	)
	tr := New(0)
	tr.Insert(model, old, workerA)
	tr.Insert(model, recent, workerA)
	tr.Insert(model, old, workerB) // B uses the old conversation later: the node is fresh, A's hold is not

	held, used := tr.MatchTenantAt(model, old, workerA)
	if held != len(old) || used == 0 {
		t.Fatalf("MatchTenantAt = %d, %d; want %d and a stamp", held, used, len(old))
	}
	tr.Forget(workerA, used) // A's cache reported it evicted the old conversation
	checkInvariants(t, tr)

	if got := tr.MatchTenant(model, old, workerA); got != len("sys|user: ") {
		t.Errorf("A still counts %d bytes of the evicted conversation, want only the prefix it used since (%d)", got, len("sys|user: "))
	}
	if got := tr.MatchTenant(model, recent, workerA); got != len(recent) {
		t.Errorf("A holds %d bytes of the conversation it used after the mark, want all %d", got, len(recent))
	}
	if m := tr.Match(model, old); m.Matched != len(old) || !slices.Equal(m.Holders, []string{workerB}) || !slices.Equal(m.WholeHolders, []string{workerB}) {
		t.Errorf("Match = %+v; want the old conversation held by B alone", m)
	}
}

func TestForget_ANewInsertCountsTheHoldAgain(t *testing.T) {
	const key = "sys|user: hello|"
	tr := New(0)
	tr.Insert(model, key, workerA)
	_, used := tr.MatchTenantAt(model, key, workerA)
	tr.Forget(workerA, used)
	if m := tr.Match(model, key); m.Matched != 0 {
		t.Fatalf("Match after Forget = %+v, want nothing", m)
	}
	tr.Insert(model, key, workerA) // A prefilled it again
	if got := tr.MatchTenant(model, key, workerA); got != len(key) {
		t.Errorf("A holds %d bytes after the new Insert, want %d", got, len(key))
	}
}

func TestForget_ARemovedTenantsIDStartsWithoutAMark(t *testing.T) {
	tr := New(0)
	tr.Insert(model, "sys|a|", workerA)
	_, used := tr.MatchTenantAt(model, "sys|a|", workerA)
	tr.Forget(workerA, used)
	tr.RemoveTenant(workerA)
	tr.Insert(model, "sys|b|", workerB) // takes A's freed id
	if got := tr.MatchTenant(model, "sys|b|", workerB); got != len("sys|b|") {
		t.Errorf("the tenant reusing a forgotten id holds %d bytes, want %d", got, len("sys|b|"))
	}
	if tr.forgetting != 0 {
		t.Errorf("forgetting = %d after the marked tenant left, want 0", tr.forgetting)
	}
}

// Holdings must agree with MatchTenant for every tenant, forgotten holds included.
func TestHoldings_AgreesWithMatchTenantForEveryTenant(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 13))
	tenants := []string{workerA, workerB, workerC}
	words := []string{"sys|", "tools|", "user: a|", "user: b|", "assistant: c|", "user: d|"}
	key := func() string {
		s := ""
		for range 1 + rng.IntN(6) {
			s += words[rng.IntN(len(words))]
		}
		return s
	}
	tr := New(0)
	var keys []string
	for i := range 400 {
		k, tenant := key(), tenants[rng.IntN(len(tenants))]
		tr.Insert(model, k, tenant)
		keys = append(keys, k)
		if i%37 == 0 {
			_, used := tr.MatchTenantAt(model, keys[rng.IntN(len(keys))], tenant)
			tr.Forget(tenant, used)
		}
		probe := key()
		got := map[string]int{}
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

func maxHeld(h map[string]int) int {
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
				tr.Insert(model, fmt.Sprintf("%sconversation %d|%s", shared, i, string(make([]byte, 2048))), fmt.Sprintf("http://10.0.0.%d:8000", i%tenants))
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
