package prefixtree

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// checkProbe fails unless one Probe of key says what Matches, Holdings and MatchTenantAt say of
// it, for every tenant.
func checkProbe(t *testing.T, tr *Tree, key string, tenants []tenant.ID) {
	t.Helper()
	var p Probe
	tr.Probe(&p, model, key, nil)
	counted, taught := tr.Matches(model, key)
	if p.Matched != counted.Matched || p.Branch != counted.Branch || p.Whole != taught.Whole {
		t.Fatalf("Probe(%q) = matched %d, branch %d, whole %d; Matches = %d, %d, %d", key,
			p.Matched, p.Branch, p.Whole, counted.Matched, counted.Branch, taught.Whole)
	}
	if got := p.Holders(nil); !slices.Equal(got, counted.Holders) {
		t.Fatalf("Probe(%q).Holders = %q, Match's = %q", key, got, counted.Holders)
	}
	if got := p.WholeHolders(nil); !slices.Equal(got, taught.WholeHolders) {
		t.Fatalf("Probe(%q).WholeHolders = %q, the taught Match's = %q", key, got, taught.WholeHolders)
	}
	// With an array lent for the holds past the inline ones, too small or large enough, the
	// probe says the same.
	for _, spare := range [][]Hold{make([]Hold, 0, 1), make([]Hold, 3, 64)} {
		var q Probe
		if tr.Probe(&q, model, key, spare); !slices.Equal(q.Holds(), p.Holds()) {
			t.Fatalf("Probe(%q) lent %d holds' room = %+v, without = %+v", key, cap(spare), q.Holds(), p.Holds())
		}
	}
	seen := map[tenant.ID]bool{}
	for _, h := range p.Holds() {
		if seen[h.Tenant] || h.Taught < h.Held || h.Taught == 0 {
			t.Fatalf("Probe(%q) holds %+v: listed twice, or taught less than held, or nothing", key, h)
		}
		seen[h.Tenant] = true
	}
	holdings := map[tenant.ID]int{}
	for _, h := range tr.Holdings(model, key, nil) {
		holdings[h.Tenant] = h.Held
	}
	for _, tenant := range tenants {
		got := p.Of(tenant)
		held, age := tr.MatchTenantAt(model, key, tenant)
		if got.Held != held || got.Age != age || got.Held != holdings[tenant] {
			t.Fatalf("Probe(%q).Of(%s) = held %d, age %d; MatchTenantAt = %d, %d; Holdings = %d",
				key, tenant, got.Held, got.Age, held, age, holdings[tenant])
		}
	}
}

// A probe must agree with the walks it replaces on every key of a tree that is taught, loses
// tenants, has failed attempts released and horizons set and grown, whether its tenants fit in
// the probe or spill out of it.
func TestProbe_AgreesWithMatchesHoldingsAndMatchTenantAt(t *testing.T) {
	for _, n := range []int{3, ProbeInline + 5} {
		t.Run(fmt.Sprintf("tenants=%d", n), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(11, uint64(n)))
			tenants := make([]tenant.ID, n)
			for i := range tenants {
				tenants[i] = tenant.ID(fmt.Sprintf("http://10.0.0.%d:8000", i))
			}
			key := func() string { return randomTurnsKey(rng, 7) }
			tr := New(0)
			var keys []string
			for i := range 600 {
				k, tenant := key(), tenants[rng.IntN(len(tenants))]
				held := tr.MatchTenant(model, k, tenant)
				tr.Insert(model, k, tenant)
				keys = append(keys, k)
				switch i % 41 {
				case 7:
					_, age := tr.MatchTenantAt(model, keys[rng.IntN(len(keys))], tenant)
					tr.Evicted(tenant, age)
				case 19:
					tr.Kept(tenant)
				case 23:
					tr.Release(model, k, tenant, held)
				case 37:
					tr.RemoveTenant(tenants[rng.IntN(len(tenants))])
				}
				checkProbe(t, tr, key(), tenants)
				checkProbe(t, tr, keys[rng.IntN(len(keys))], tenants)
			}
			checkInvariants(t, tr)
		})
	}
}

func TestProbe_OfAnUnknownNamespaceIsEmpty(t *testing.T) {
	tr := New(0)
	tr.Insert("other", "sys|user: a|", workerA)
	var p Probe
	tr.Probe(&p, model, "sys|user: a|", nil)
	if p.Matched != 0 || p.Whole != 0 || len(p.Holds()) != 0 || p.Of(workerA).Held != 0 || p.Holders(nil) != nil {
		t.Fatalf("a namespace never taught: %+v", p)
	}
}

// BenchmarkProbe is one probe of a conversation's next turn against the three walks it replaces
// in a decision (Matches, Holdings, MatchTenantAt), and against the one walk of MatchTenantAt
// alone, all a decision that follows its session map read before.
func BenchmarkProbe(b *testing.B) {
	for _, tenants := range []int{4, 64} {
		tr := New(0)
		shared := "system prompt and tools|" + string(make([]byte, 4096))
		for i := range tenants * 8 {
			tr.Insert(model, fmt.Sprintf("%sconversation %d|%s", shared, i, string(make([]byte, 2048))), tenant.ID(fmt.Sprintf("http://10.0.0.%d:8000", i%tenants)))
		}
		key := fmt.Sprintf("%sconversation %d|%s|next turn", shared, 3, string(make([]byte, 2048)))
		b.Run(fmt.Sprintf("tenants=%d/probe", tenants), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var p Probe
				if tr.Probe(&p, model, key, nil); p.Of("http://10.0.0.3:8000").Held == 0 {
					b.Fatal("the conversation's worker holds none of it")
				}
			}
		})
		b.Run(fmt.Sprintf("tenants=%d/probe-reusing", tenants), func(b *testing.B) {
			var spare []Hold
			b.ReportAllocs()
			for b.Loop() {
				var p Probe
				if tr.Probe(&p, model, key, spare); p.Of("http://10.0.0.3:8000").Held == 0 {
					b.Fatal("the conversation's worker holds none of it")
				}
				if h := p.Spill(); h != nil {
					spare = h
				}
			}
		})
		b.Run(fmt.Sprintf("tenants=%d/one-tenant", tenants), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if held, _ := tr.MatchTenantAt(model, key, "http://10.0.0.3:8000"); held == 0 {
					b.Fatal("the conversation's worker holds none of it")
				}
			}
		})
		b.Run(fmt.Sprintf("tenants=%d/three-walks", tenants), func(b *testing.B) {
			dst := make([]Holding, 0, tenants)
			b.ReportAllocs()
			for b.Loop() {
				tr.Matches(model, key)
				dst = tr.Holdings(model, key, dst[:0])
				if held, _ := tr.MatchTenantAt(model, key, "http://10.0.0.3:8000"); held == 0 {
					b.Fatal("the conversation's worker holds none of it")
				}
			}
		})
	}
}
