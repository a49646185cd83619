package prefixtree

import (
	"slices"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// fuzzTenants include tenants that share the base "u" with and without a rank, and look-alikes
// that must survive RemoveTenantsWithBase("u").
var fuzzTenants = []string{"u", "u@0", "u@1", "u2", "ux@0", "v", "v@3", "u@"}

var fuzzBases = []string{"u", "v", "u@1", "w"}

// referenceTree is the naive model the fuzz target compares against: the set of
// (key, tenant) pairs that were inserted and not removed.
type referenceTree map[[2]string]bool

func (r referenceTree) heldBy(key, tenant string) int {
	best := 0
	for p := range r {
		if p[1] == tenant {
			best = max(best, commonPrefixLen(p[0], key))
		}
	}
	return best
}

func (r referenceTree) match(key string) Match {
	var m Match
	for _, tenant := range fuzzTenants {
		switch n := r.heldBy(key, tenant); {
		case n == 0 || n < m.Matched:
		case n > m.Matched:
			m = Match{Matched: n, Holders: []string{tenant}}
		default:
			m.Holders = append(m.Holders, tenant)
		}
	}
	slices.Sort(m.Holders)
	return m
}

// chars counts the distinct non-empty prefixes of the stored keys: one per stored byte.
func (r referenceTree) chars() int {
	prefixes := map[string]bool{}
	for p := range r {
		for i := 1; i <= len(p[0]); i++ {
			prefixes[p[0][:i]] = true
		}
	}
	return len(prefixes)
}

func (r referenceTree) removeIf(drop func(tenant string) bool) {
	for p := range r {
		if drop(p[1]) {
			delete(r, p)
		}
	}
}

// FuzzTree runs a sequence of operations decoded from the input against a Tree and the
// reference model and fails on any disagreement. The budget is unlimited so eviction stays
// out of the comparison; the tree's own invariants are checked after every step.
func FuzzTree(f *testing.F) {
	f.Add([]byte{0, 3, 0, 1, 2, 0, 0, 5, 0, 1, 2, 1, 1, 1, 3, 0, 1, 2})
	f.Add([]byte{0, 4, 0, 0, 0, 0, 1, 0, 2, 0, 0, 2, 2, 5, 0, 0, 1, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		// The reference model is quadratic; a few dozen operations find every bug it can.
		data = data[:min(len(data), 512)]
		tr := New(0)
		ref := referenceTree{}
		next := func() byte {
			if len(data) == 0 {
				return 0
			}
			b := data[0]
			data = data[1:]
			return b
		}
		for len(data) > 0 {
			op := next() % 5
			who := fuzzTenants[int(next())%len(fuzzTenants)]
			key := make([]byte, next()%12)
			for i := range key {
				key[i] = 'a' + next()%3
			}
			k := string(key)

			switch op {
			case 0:
				tr.Insert(k, who)
				if k != "" {
					ref[[2]string{k, who}] = true
				}
			case 1:
				got, want := tr.Match(k), ref.match(k)
				if got.Matched != want.Matched || !slices.Equal(got.Holders, want.Holders) {
					t.Fatalf("Match(%q) = {%d %q}, want {%d %q}", k, got.Matched, got.Holders, want.Matched, want.Holders)
				}
			case 2:
				if got, want := tr.MatchTenant(k, who), ref.heldBy(k, who); got != want {
					t.Fatalf("MatchTenant(%q, %q) = %d, want %d", k, who, got, want)
				}
			case 3:
				before := tr.Bytes()
				ref.removeIf(func(s string) bool { return s == who })
				if got, want := tr.RemoveTenant(who), before-tr.Bytes(); got != want {
					t.Fatalf("RemoveTenant(%q) freed %d, Bytes() fell by %d", who, got, want)
				}
			case 4:
				base := fuzzBases[int(key2byte(k))%len(fuzzBases)]
				before := tr.Bytes()
				ref.removeIf(func(s string) bool { return tenant.HasBase(s, base) })
				if got, want := tr.RemoveTenantsWithBase(base), before-tr.Bytes(); got != want {
					t.Fatalf("RemoveTenantsWithBase(%q) freed %d, Bytes() fell by %d", base, got, want)
				}
			}
			if got, want := tr.Chars(), ref.chars(); got != want {
				t.Fatalf("after op %d: Chars() = %d, want %d", op, got, want)
			}
			checkInvariants(t, tr)
		}
	})
}

func key2byte(k string) byte {
	if k == "" {
		return 0
	}
	return k[0] + byte(len(k))
}
