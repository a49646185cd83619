package prefixtree

import (
	"slices"
	"testing"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// fuzzTenants include tenants that share the base "u" with and without a rank, and look-alikes
// that must survive RemoveTenantsWithBase("u").
var fuzzTenants = []tenant.ID{"u", "u@0", "u@1", "u2", "ux@0", "v", "v@3", "u@"}

var fuzzBases = []string{"u", "v", "u@1", "w"}

// fuzzSpaces are namespaces whose names joined to the fuzzer's keys (over "abc") collide:
// ("", "abc"), ("a", "bc") and ("ab", "c") would be one key if a namespace were a key prefix.
var fuzzSpaces = []string{"a", "ab", ""}

// refEntry is one (namespace, key, tenant) triple the reference model holds.
type refEntry struct {
	ns, key string
	tenant  tenant.ID
}

// referenceTree is the naive model the fuzz target compares against: the set of
// (namespace, key, tenant) triples that were inserted and not removed.
type referenceTree map[refEntry]bool

func (r referenceTree) heldBy(ns, key string, worker tenant.ID) int {
	best := 0
	for e := range r {
		if e.ns == ns && e.tenant == worker {
			best = max(best, commonPrefixLen(e.key, key))
		}
	}
	return best
}

func (r referenceTree) match(ns, key string) Match {
	var m Match
	for _, worker := range fuzzTenants {
		switch n := r.heldBy(ns, key, worker); {
		case n == 0 || n < m.Matched:
		case n > m.Matched:
			m = Match{Matched: n, Holders: []tenant.ID{worker}}
		default:
			m.Holders = append(m.Holders, worker)
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

// release is Release in the model: tenant keeps, of each of its keys in ns that runs past byte
// from of key, the first from bytes (which are key's), and nothing if from is 0.
func (r referenceTree) release(ns, key string, worker tenant.ID, from int) {
	for e := range r {
		if e.ns == ns && e.tenant == worker && commonPrefixLen(e.key, key) > from {
			delete(r, e)
			if from > 0 {
				r[refEntry{ns, key[:from], worker}] = true
			}
		}
	}
}

// releaseFrom is where Release(ns, key, _, held) starts dropping holds in tr: the start of the
// first node on key's path that begins at or after byte held (false if key's path ends, or
// leaves the tree, before one). Holding is per node, so the model needs the tree's node
// boundaries; everything else about Release it predicts on its own.
func releaseFrom(tr *Tree, ns, key string, held int) (int, bool) {
	tr.mu.RLock()
	defer tr.mu.RUnlock()
	n := tr.spaces[ns]
	if n == nil || held >= len(key) {
		return 0, false
	}
	pos := 0
	for pos < len(key) {
		c, _ := n.child(key[pos])
		if c == nil {
			return 0, false
		}
		if pos >= held {
			return pos, true
		}
		l := commonPrefixLen(c.label, key[pos:])
		if l < len(c.label) {
			return 0, false
		}
		pos += l
		n = c
	}
	return 0, false
}

func (r referenceTree) removeIf(drop func(tenant.ID) bool) {
	for e := range r {
		if drop(e.tenant) {
			delete(r, e)
		}
	}
}

// FuzzTree runs a sequence of operations decoded from the input against a Tree and the
// reference model and fails on any disagreement. Each operation byte picks the operation
// (byte % 6) and the namespace (byte / 6 % 3), so bytes below 6 all work in the first one. An
// operation reads a tenant byte, a length byte and that many key bytes; a Release reads one
// byte more: 128 and above inserts the key and releases it at once, as a failed attempt does,
// and below it releases the key at that byte. The budget is unlimited so eviction stays out of
// the comparison; the tree's own invariants are checked after every step.
func FuzzTree(f *testing.F) {
	f.Add([]byte{0, 3, 0, 1, 2, 0, 0, 5, 0, 1, 2, 1, 1, 1, 3, 0, 1, 2})
	f.Add([]byte{0, 4, 0, 0, 0, 0, 1, 0, 2, 0, 0, 2, 2, 5, 0, 0, 1, 1, 1})
	// "abc" in namespace "", "bc" in "a", then look "c" up in "ab": joined, all three are "abc".
	f.Add([]byte{12, 0, 3, 0, 1, 2, 0, 5, 2, 1, 2, 7, 0, 1, 2, 13, 0, 3, 0, 1, 2, 2, 5, 2, 1, 2, 3, 0, 0, 9, 5, 0})
	// "u" holds "abc" and "v" "abcab"; "u" is sent "abcabc", which fails: "u" loses the part of
	// "v"'s node it had joined and the new leaf, and "v" keeps its hold.
	f.Add([]byte{0, 0, 3, 0, 1, 2, 0, 5, 5, 0, 1, 2, 0, 1, 5, 0, 6, 0, 1, 2, 0, 1, 2, 200,
		1, 0, 6, 0, 1, 2, 0, 1, 2, 2, 0, 6, 0, 1, 2, 0, 1, 2})
	// "u" holds the single node "abcab": releasing it at byte 2 keeps the straddling node;
	// after "abcabcc" is inserted, releasing that at byte 2 drops only the node past "abcab";
	// releasing "abc" from -1 empties the namespace.
	f.Add([]byte{0, 0, 5, 0, 1, 2, 0, 1, 5, 0, 5, 0, 1, 2, 0, 1, 3, 0, 0, 7, 0, 1, 2, 0, 1, 2, 2,
		5, 0, 7, 0, 1, 2, 0, 1, 2, 2, 3, 5, 0, 3, 0, 1, 2, 0, 1, 0, 3, 0, 1, 2})
	// A failed attempt in namespace "ab".
	f.Add([]byte{6, 1, 2, 0, 1, 11, 1, 4, 0, 1, 0, 1, 200, 7, 0, 4, 0, 1, 0, 1})
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
			op, ns := opByte%6, fuzzSpaces[int(opByte/6)%len(fuzzSpaces)]
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
				ref.removeIf(func(s tenant.ID) bool { return s == who })
				if got, want := tr.RemoveTenant(who), before-tr.Bytes(); got != want {
					t.Fatalf("RemoveTenant(%q) freed %d, Bytes() fell by %d", who, got, want)
				}
			case 4:
				base := fuzzBases[int(key2byte(k))%len(fuzzBases)]
				before := tr.Bytes()
				ref.removeIf(func(s tenant.ID) bool { return tenant.HasBase(string(s), base) })
				if got, want := tr.RemoveTenantsWithBase(base), before-tr.Bytes(); got != want {
					t.Fatalf("RemoveTenantsWithBase(%q) freed %d, Bytes() fell by %d", base, got, want)
				}
			case 5:
				if h := int(next()); h >= 128 {
					// A failed attempt: Insert, then Release at what the tenant held before.
					held := tr.MatchTenant(ns, k, who)
					tr.Insert(ns, k, who)
					checkInvariants(t, tr)
					before := tr.Bytes()
					if got, want := tr.Release(ns, k, who, held), before-tr.Bytes(); got != want || got < 0 {
						t.Fatalf("Release(%q, %q, %q, %d) after Insert freed %d, Bytes() fell by %d", ns, k, who, held, got, want)
					}
					if got := tr.MatchTenant(ns, k, who); got != held {
						t.Fatalf("MatchTenant(%q, %q, %q) = %d after Insert and Release, want %d as before", ns, k, who, got, held)
					}
				} else {
					held := h%(len(k)+2) - 1 // -1 to len(k)
					if from, ok := releaseFrom(tr, ns, k, held); ok {
						ref.release(ns, k, who, from)
					}
					before := tr.Bytes()
					if got, want := tr.Release(ns, k, who, held), before-tr.Bytes(); got != want || got < 0 {
						t.Fatalf("Release(%q, %q, %q, %d) freed %d, Bytes() fell by %d", ns, k, who, held, got, want)
					}
					if got, want := tr.MatchTenant(ns, k, who), ref.heldBy(ns, k, who); got != want {
						t.Fatalf("MatchTenant(%q, %q, %q) = %d after Release at %d, want %d", ns, k, who, got, held, want)
					}
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
