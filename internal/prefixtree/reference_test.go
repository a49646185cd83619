package prefixtree

import (
	"slices"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// The lookups below answer, each in a walk of its own, what one Probe answers of a key: the
// reference the tests check Probe against (probe_test.go), written as plainly as the questions.
// The router asks Probe alone, so they live with the tests.

// Match is the result of a longest-prefix lookup in one namespace. Its lengths are bytes of
// the key; the namespace's name counts in none of them.
type Match struct {
	// Matched is the number of bytes of the key matched by the deepest holders.
	Matched int
	// Holders are every tenant that holds exactly the longest matched prefix, sorted.
	// Empty when Matched is 0.
	Holders []tenant.ID
	// Whole is the length of the longest key inserted before that is a prefix of this key (0
	// if none): the part of the key that continues something the tree was given whole, such
	// as the previous turn of the same conversation, rather than a prefix several keys share.
	Whole int
	// WholeHolders are every tenant that holds that whole prefix, sorted.
	WholeHolders []tenant.ID
	// Branch is the length of the matched prefix up to the deepest point on it where keys
	// already in the tree diverge (0 if none): the part of the match shared by several
	// conversations, such as a common system prompt. Matched − Branch is the part that
	// continues one line of keys only: the conversation the query most likely belongs to.
	Branch int
}

// Match returns the longest prefix of key held by any tenant in namespace ns and every tenant
// holding it. Holds beyond their tenant's horizon (Reach) do not count.
func (t *Tree) Match(ns, key string) Match {
	counted, _ := t.Matches(ns, key)
	return counted
}

// Matches returns, in one walk, the Match of key that counts and the one of everything the tree
// was taught, horizons ignored: where a conversation was sent, even if its worker has since
// lost part of it. The two are the same while no tenant has a horizon.
func (t *Tree) Matches(ns, key string) (counted, taught Match) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := t.spaces[ns]
	if n == nil {
		return Match{}, Match{}
	}
	var cw, tw matchWalk
	counting := true
	rest := key
	for len(rest) > 0 {
		c, _ := n.child(rest[0])
		if c == nil {
			break
		}
		l := commonPrefixLen(c.label, rest)
		full := l == len(c.label)
		tw.step(c, l, full)
		if counting = counting && t.heldLocked(c); counting {
			cw.step(c, l, full)
		}
		if !full {
			break
		}
		rest = rest[l:]
		n = c
	}
	counted = cw.result(t.namesLocked)
	if t.bounded == 0 {
		return counted, counted
	}
	return counted, tw.result(t.allNamesLocked)
}

// matchWalk accumulates a Match down a key's path.
type matchWalk struct {
	matched, whole, branch int
	deepest, wholeNode     *node
}

// step takes node c, of which the key matched l bytes (all of its label when full).
func (w *matchWalk) step(c *node, l int, full bool) {
	w.matched += l
	w.deepest = c
	if !full {
		return
	}
	if c.keyEnd {
		w.whole, w.wholeNode = w.matched, c
	}
	if len(c.children) > 1 {
		w.branch = w.matched
	}
}

func (w *matchWalk) result(names func([]holder) []tenant.ID) Match {
	if w.deepest == nil {
		return Match{}
	}
	m := Match{Matched: w.matched, Holders: names(w.deepest.holders), Branch: w.branch}
	if w.wholeNode != nil {
		m.Whole, m.WholeHolders = w.whole, names(w.wholeNode.holders)
	}
	return m
}

// allNamesLocked returns the sorted tenant names of all the holders, horizons ignored.
func (t *Tree) allNamesLocked(holders []holder) []tenant.ID {
	names := make([]tenant.ID, len(holders))
	for i, h := range holders {
		names[i] = t.tenantNames[h.id]
	}
	slices.Sort(names)
	return names
}

// namesLocked returns the sorted tenant names of the holders that still count.
func (t *Tree) namesLocked(holders []holder) []tenant.ID {
	names := make([]tenant.ID, 0, len(holders))
	for _, h := range holders {
		if t.live(h) {
			names = append(names, t.tenantNames[h.id])
		}
	}
	slices.Sort(names)
	return names
}

// MatchTenant returns how many bytes of key tenant holds in namespace ns (0 if none).
func (t *Tree) MatchTenant(ns, key string, worker tenant.ID) int {
	held, _ := t.MatchTenantAt(ns, key, worker)
	return held
}

// MatchTenantAt returns how many bytes of key tenant holds in namespace ns, and the age of the
// deepest of them (its oldest along the path; see Reach; 0 when it holds none), for Evicted or
// Kept once the tenant says what it served.
func (t *Tree) MatchTenantAt(ns, key string, worker tenant.ID) (held int, age uint64) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	id, ok := t.tenantIDs[worker]
	n := t.spaces[ns]
	if !ok || n == nil {
		return 0, 0
	}
	var used uint64
	rest := key
	for len(rest) > 0 {
		c, _ := n.child(rest[0])
		if c == nil {
			break
		}
		i := c.holderIndex(id)
		if i < 0 || !t.live(c.holders[i]) {
			break
		}
		used = c.holders[i].used
		l := commonPrefixLen(c.label, rest)
		held += l
		if l < len(c.label) {
			break
		}
		rest = rest[l:]
		n = c
	}
	if held == 0 {
		return 0, 0
	}
	return held, t.reach[id].Taught - used
}
