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

// fuzzSpaces are namespaces whose names joined to the fuzzer's keys (over "abc") collide:
// ("", "abc"), ("a", "bc") and ("ab", "c") would be one key if a namespace were a key prefix.
var fuzzSpaces = []string{"a", "ab", ""}

// refEntry is one (namespace, key, tenant) triple the reference model holds.
type refEntry struct{ ns, key, tenant string }

// referenceTree is the naive model the fuzz target compares against: the set of
// (namespace, key, tenant) triples that were inserted and not removed.
type referenceTree map[refEntry]bool

func (r referenceTree) heldBy(ns, key, tenant string) int {
	best := 0
	for e := range r {
		if e.ns == ns && e.tenant == tenant {
			best = max(best, commonPrefixLen(e.key, key))
		}
	}
	return best
}

func (r referenceTree) match(ns, key string) Match {
	var m Match
	for _, tenant := range fuzzTenants {
		switch n := r.heldBy(ns, key, tenant); {
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

// chars counts the distinct non-empty prefixes of the stored keys of each namespace: one per
// stored byte.
func (r referenceTree) chars() int {
	prefixes := map[[2]string]bool{}
	for e := range r {
		for i := 1; i <= len(e.key); i++ {
			prefixes[[2]string{e.ns, e.key[:i]}] = true
		}
	}
	return len(prefixes)
}

// spaces counts the namespaces holding any key.
func (r referenceTree) spaces() int {
	spaces := map[string]bool{}
	for e := range r {
		spaces[e.ns] = true
	}
	return len(spaces)
}

func (r referenceTree) removeIf(drop func(tenant string) bool) {
	for e := range r {
		if drop(e.tenant) {
			delete(r, e)
		}
	}
}

// FuzzTree runs a sequence of operations decoded from the input against a Tree and the
// reference model and fails on any disagreement. Each operation byte picks the operation
// (byte % 5) and the namespace (byte / 5 % 3), so bytes below 5 all work in the first one. The
// budget is unlimited so eviction stays out of the comparison; the tree's own invariants are
// checked after every step.
func FuzzTree(f *testing.F) {
	f.Add([]byte{0, 3, 0, 1, 2, 0, 0, 5, 0, 1, 2, 1, 1, 1, 3, 0, 1, 2})
	f.Add([]byte{0, 4, 0, 0, 0, 0, 1, 0, 2, 0, 0, 2, 2, 5, 0, 0, 1, 1, 1})
	// "abc" in namespace "", "bc" in "a", then look "c" up in "ab": joined, all three are "abc".
	f.Add([]byte{10, 0, 3, 0, 1, 2, 0, 5, 2, 1, 2, 6, 0, 1, 2, 11, 0, 3, 0, 1, 2, 2, 5, 2, 1, 2, 3, 0, 0, 8, 5, 0})
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
			opByte := next()
			op, ns := opByte%5, fuzzSpaces[int(opByte/5)%len(fuzzSpaces)]
			who := fuzzTenants[int(next())%len(fuzzTenants)]
			key := make([]byte, next()%12)
			for i := range key {
				key[i] = 'a' + next()%3
			}
			k := string(key)

			switch op {
			case 0:
				tr.Insert(ns, k, who)
				if k != "" {
					ref[refEntry{ns, k, who}] = true
				}
			case 1:
				got, want := tr.Match(ns, k), ref.match(ns, k)
				if got.Matched != want.Matched || !slices.Equal(got.Holders, want.Holders) {
					t.Fatalf("Match(%q, %q) = {%d %q}, want {%d %q}", ns, k, got.Matched, got.Holders, want.Matched, want.Holders)
				}
			case 2:
				if got, want := tr.MatchTenant(ns, k, who), ref.heldBy(ns, k, who); got != want {
					t.Fatalf("MatchTenant(%q, %q, %q) = %d, want %d", ns, k, who, got, want)
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
			if got, want := len(tr.spaces), ref.spaces(); got != want {
				t.Fatalf("after op %d: %d namespaces kept, %d hold keys", op, got, want)
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
