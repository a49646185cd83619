package prefixtree

import (
	"slices"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// ProbeInline is how many tenants a Probe keeps inside itself; the holds of a key held by more
// go to the spare array its caller lends, or to a new one. A router's fleet is mostly a handful
// of workers, so a probe allocates nothing.
const ProbeInline = 16

// Probe is what one walk of a key's path in a namespace tells: the longest prefix held, by whom,
// and what each tenant holds of the key. A router asks it once per decision and derives each
// answer from it without the lock.
type Probe struct {
	// Matched is the bytes of the key matched by the deepest holders whose holds count. Branch
	// is the length of that match up to the deepest point on it where keys already in the tree
	// diverge (0 if none): the part shared by several conversations, such as a system prompt.
	Matched int
	Branch  int
	// Whole is the length of the longest key the tree was given that is a prefix of this key,
	// horizons ignored: the conversation's own past.
	Whole int

	n      int
	inline [ProbeInline]Hold
	spill  []Hold // every hold once there are more than ProbeInline; nil until then
	spare  []Hold // the caller's array for spill, when it lent one
}

// Hold is what one tenant holds of a probed key.
type Hold struct {
	Tenant tenant.ID
	// Held is how many bytes of the key the tenant holds that count; Age is how old the deepest
	// of them is (see Reach), 0 when Held is 0.
	Held int
	Age  uint64
	// Taught is how many bytes of the key the tenant was given, horizons ignored: at least Held.
	Taught int
}

// Holds are the tenants holding any prefix of the key, horizons ignored, in no set order.
func (p *Probe) Holds() []Hold {
	if p.spill != nil {
		return p.spill
	}
	return p.inline[:p.n]
}

// Spill is the array the holds past the first ProbeInline went to, nil when they fit inside
// the probe: lent to the next probe, it is reused.
func (p *Probe) Spill() []Hold { return p.spill }

// Of is what tenant holds of the key; the zero Hold when it holds none.
func (p *Probe) Of(worker tenant.ID) Hold {
	for _, h := range p.Holds() {
		if h.Tenant == worker {
			return h
		}
	}
	return Hold{}
}

// Holders appends to dst, sorted, every tenant holding exactly the longest prefix that counts.
// It appends none when Matched is 0.
func (p *Probe) Holders(dst []tenant.ID) []tenant.ID {
	if p.Matched == 0 {
		return dst
	}
	start := len(dst)
	for _, h := range p.Holds() {
		if h.Held == p.Matched {
			dst = append(dst, h.Tenant)
		}
	}
	slices.Sort(dst[start:])
	return dst
}

// WholeHolders appends to dst, sorted, every tenant holding the whole earlier key of length
// Whole, horizons ignored. It appends none when Whole is 0.
func (p *Probe) WholeHolders(dst []tenant.ID) []tenant.ID {
	if p.Whole == 0 {
		return dst
	}
	start := len(dst)
	for _, h := range p.Holds() {
		if h.Taught >= p.Whole {
			dst = append(dst, h.Tenant)
		}
	}
	slices.Sort(dst[start:])
	return dst
}

// add appends h and returns its index; tenants is how many tenants there are, what a spill
// may need at most.
func (p *Probe) add(h Hold, tenants int) int {
	switch {
	case p.spill != nil:
		p.spill = append(p.spill, h)
		return len(p.spill) - 1
	case p.n == ProbeInline:
		if cap(p.spare) < tenants {
			p.spare = make([]Hold, 0, tenants)
		}
		p.spill = append(append(p.spare[:0], p.inline[:]...), h)
		return len(p.spill) - 1
	}
	p.inline[p.n] = h
	p.n++
	return p.n - 1
}

// at returns the hold at index i.
func (p *Probe) at(i int) *Hold {
	if p.spill != nil {
		return &p.spill[i]
	}
	return &p.inline[i]
}

// Probe walks key's path in namespace ns once and sets p to what it tells (see Probe); p is
// filled in place, as a Probe is too large to be worth copying out. Holds beyond their
// tenant's horizon (Reach) count in Matched, Branch and Held not at all. spare, which may be
// nil, is an array the holds past the first ProbeInline may go to, so that a caller probing for
// a large fleet can reuse one (Spill returns it, or the larger one that replaced it).
//
// The holders of a node hold its parent too, each no younger there, so a tenant's holds that
// count are a prefix of the path it holds: its deepest one that counts is where its Held ends,
// and the first node nobody's hold counts on ends the match that counts.
func (t *Tree) Probe(p *Probe, ns, key string, spare []Hold) {
	t.mu.RLock()
	defer t.mu.RUnlock()
	*p = Probe{spare: spare}
	n := t.spaces[ns]
	if n == nil {
		return
	}
	// index maps a tenant id to its hold's index + 1.
	var small [64]uint16
	index := small[:]
	if len(t.tenantNames) > len(small) {
		index = make([]uint16, len(t.tenantNames))
	}
	matched, counting := 0, true
	rest := key
	for len(rest) > 0 {
		c, _ := n.child(rest[0])
		if c == nil {
			break
		}
		l := commonPrefixLen(c.label, rest)
		full := l == len(c.label)
		matched += l
		if full && c.keyEnd {
			p.Whole = matched
		}
		if counting = counting && t.heldLocked(c); counting {
			p.Matched = matched
			if full && len(c.children) > 1 {
				p.Branch = matched
			}
		}
		for _, h := range c.holders {
			i := int(index[h.id]) - 1
			if i < 0 {
				i = p.add(Hold{Tenant: t.tenantNames[h.id]}, len(t.tenantNames))
				index[h.id] = uint16(i + 1)
			}
			hold := p.at(i)
			hold.Taught = matched
			if counting && t.live(h) {
				hold.Held, hold.Age = matched, t.reach[h.id].Taught-h.used
			}
		}
		if !full {
			break
		}
		rest = rest[l:]
		n = c
	}
}
