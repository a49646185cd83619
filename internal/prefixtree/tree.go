// Package prefixtree is the multi-tenant radix tree behind cache-aware routing: it records
// which worker tenants were sent which chat-history keys, so the router can ask "which worker
// most likely still holds the longest prefix of this conversation in its KV cache?".
//
// A tenant that is sent a key holds that key and every prefix of it. Keys are serialized chat
// histories that grow turn by turn, so the tree is mostly one shared trunk (the system
// prompt) with one branch per conversation and one node per turn.
//
// # Namespaces
//
// Every key lives in a namespace; the router uses one per model, because a worker's KV cache
// is per model. A namespace is an independent radix tree with its own root inside the one
// Tree: keys in different namespaces never match each other, however alike, and the namespace
// is never joined to a key, so a lookup copies nothing and the lengths Probe reports are bytes
// of the key alone. All namespaces share one lock, one budget, one leaf heap and one tenant
// table: eviction takes the least recently used leaf whichever namespace holds it, so one
// budget bounds the whole tree, and removing a tenant clears it in every namespace. A
// namespace's root and its map entry are charged like any node; once eviction or removal
// takes a namespace's last leaf the namespace is dropped, so the namespaces of models no
// longer routed do not accumulate.
//
// # Budget and eviction
//
// The budget is on heap bytes, not on characters of history: a tree built with New(maxBytes)
// charges every node what it costs the heap — its struct, its label, and the arrays behind its
// edges, children and holders at their capacity, each rounded up to the allocation size the Go
// allocator hands out — plus each namespace's root and map entry, the leaf heap's array and
// the interned tenant names. Bytes reports the charge; Chars reports the history stored (the
// label bytes). A label budget would not bound memory: a short key such as "req 42" costs a
// node of over a hundred bytes for a byte or two of label, so 200,000 such keys under a 4 MiB
// label budget held 30 MB of heap. Every mutation keeps the charge exact (the tests recompute
// it from scratch), so the live heap the tree holds stays within a few percent of Bytes.
//
// Eviction is by whole leaf, least recently used first: a leaf's access time is the last
// Insert by any tenant whose key ran through it, and evicting it drops every tenant's hold on
// it and frees its node. Whole leaves are evicted (rather than one tenant's hold on a leaf)
// because a node's memory is freed only when nobody holds it; evicting one tenant's hold at a
// time would spend work without bringing the tree under budget. The cost is that a tenant's
// stale hold on a leaf survives as long as another tenant keeps that leaf fresh. Leaves sit in
// a min-heap keyed by access time, so eviction costs O(log leaves) per leaf and never scans
// the tree.
//
// Evict brings the tree to the budget and is meant for a periodic background sweep. Insert
// evicts on its own only when the tree is more than 10% over budget, so the sweep does the
// work in the common case and Bytes never stays above 1.1× the budget after an Insert.
//
// Probe and Holdings do not refresh access times: they run under a read lock, and the router
// inserts the key it routes right after deciding, which refreshes the path. Probe answers in one
// walk of a key's path everything one decision asks of it.
//
// # Release
//
// The router teaches the tree when it sends a request, before the worker answers. Release
// undoes that for an attempt that failed: given how many bytes of the key the tenant held
// before (its Probe's Held), it drops the tenant's hold on the key's path from the first
// node that begins at or after that byte, prunes what nobody holds any more, and leaves other
// tenants' holds alone. Holding is per node and Insert splits the path where the key leaves
// what the tenant held, so when nothing else was inserted for the tenant along the key in
// between, a Probe finds the tenant holding what it held before the Insert.
//
// # Memory
//
// Labels are copied when a node is created or split, so the tree never pins a caller's
// request body. Tenants are interned to uint32 ids; a node holds a small slice of ids and one
// access stamp. A node's struct takes 112 bytes and its slices a few tens more whatever the
// length of its label, so what a stored character costs depends on the key shape: about 150
// heap bytes per key (and per character) for counter-like short keys, about 1.16 bytes per
// character for chat histories that grow by a few hundred bytes or more per turn. A namespace
// adds about 200 bytes (its root, its name and its map entry). Either way the live heap stays
// within a few percent of Bytes, and so of the budget (TestBudget_BoundsHeapForShortKeys,
// TestBudget_BoundsHeapForGrowingHistories, BenchmarkMemory).
package prefixtree

import (
	"slices"
	"strings"
	"sync"
	"unsafe"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// overBudgetSlack is how far past maxBytes an Insert may leave the tree before it evicts on
// its own, as a fraction of maxBytes (10%).
const overBudgetSlack = 10

// tenantEntryBytes is charged per interned tenant on top of its name: its entry in the
// tenantIDs map (key header, id and the map's spare slots). Maps do not expose their size, so
// this is an estimate; tenants are a handful of workers, so it does not move the total.
const tenantEntryBytes = 48

// tenantCost is what interning tenant costs the heap, beyond the tenantNames slot.
func tenantCost(worker tenant.ID) int { return allocBytes(len(worker)) + tenantEntryBytes }

// spaceEntryBytes is charged per namespace for its entry in the spaces map (key header, root
// pointer and the map's spare slots): a map[string]*node measures 35 to 55 bytes per entry
// depending on how full its table is. The namespace's name is its root's label, charged with
// the root.
const spaceEntryBytes = 48

// spaceCost is what the namespace of root costs the heap: the root node and its map entry.
func spaceCost(root *node) int { return root.heapBytes() + spaceEntryBytes }

// minSpacesPeak is the size below which the spaces map is never rebuilt to shrink it.
const minSpacesPeak = 64

// Tree is a prefix tree of keys in namespaces. It is safe for concurrent use; one lock covers
// every namespace, as the budget, the leaf heap and the tenant table they share must change
// together.
type Tree struct {
	mu sync.RWMutex
	// spaces maps a namespace to its root. A root's label is its namespace's name; it has no
	// parent, no holders and at least one child, and never sits in the leaf heap. A Go map
	// keeps its table at its largest size when entries are deleted, so once the map holds
	// fewer than half the entries it held at its peak, it is rebuilt at its current size.
	spaces     map[string]*node
	spacesPeak int
	leaves     leafHeap
	clock      uint64

	// chars is the sum of the label lengths of non-root nodes. nodeBytes is the heap charged
	// to nodes: every node's heapBytes, plus each namespace's spaceCost. tenantBytes is the
	// heap charged to interned tenants. Bytes adds the arrays the tree keeps for all nodes and
	// tenants (bytesLocked).
	chars       int
	nodeBytes   int
	tenantBytes int
	maxBytes    int

	tenantIDs   map[tenant.ID]uint32
	tenantNames []tenant.ID // indexed by id; "" for a free id
	freeIDs     []uint32
	// reach is, by tenant id, how much the tenant was taught and how far back its cache is
	// known to reach (see Reach); bounded counts the tenants whose reach is known, so that
	// lookups skip the check while there are none.
	reach   []Reach
	bounded int
}

// Reach models a tenant's cache the way vLLM's prefix cache evicts: a finished request's blocks
// join the back of the free queue, tail first (freed in reverse order), and eviction takes from
// the front. Taught counts the bytes of every key the tenant was given. A hold is stamped, at
// each Insert through it, with Taught less the offset of its end in that key, so its age,
// Taught − stamp, is how much was given to the tenant since plus how far down its key it sits:
// roughly its distance from the back of the queue, the tail of a conversation ahead of its
// head, and every older request ahead of a newer one. (Text given again counts again, where the
// queue holds a block once; the horizon, learned in the same measure, absorbs it.)
// Horizon, when not 0, is the age from which the tenant's holds no longer count: its cache has
// evicted them. Evicted and Kept learn it from what the tenant reports it served.
type Reach struct {
	Taught  uint64
	Horizon uint64
}

// New returns an empty tree whose heap use, as Bytes counts it, is held to maxBytes.
// maxBytes <= 0 means no budget: nothing is ever evicted.
func New(maxBytes int) *Tree {
	return &Tree{maxBytes: maxBytes, spaces: make(map[string]*node), tenantIDs: make(map[tenant.ID]uint32)}
}

// Insert records that tenant now holds key, and every prefix of it, in namespace ns, and
// marks the path as just used. If the tree ends up more than 10% over budget it evicts down
// to the budget, in any namespace, and returns the bytes freed, as Bytes counts them.
func (t *Tree) Insert(ns, key string, worker tenant.ID) (freed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if key == "" {
		return 0
	}
	id := t.internLocked(worker)
	t.clock++
	now := t.clock

	// The path's holds are stamped after the walk, with the tenant's Taught once this key
	// counts in it.
	n := t.spaceLocked(ns)
	rest := key
	for len(rest) > 0 {
		c, i := n.child(rest[0])
		if c == nil {
			leaf := &node{label: cloneLabel(rest), holders: []holder{{id: id}}, lastUsed: now}
			if !n.isRoot() && len(n.children) == 0 {
				t.leaves.remove(n)
			}
			t.nodeBytes += n.addChild(leaf) + leaf.heapBytes()
			t.leaves.push(leaf)
			t.chars += len(leaf.label)
			n = leaf
			break
		}
		l := commonPrefixLen(c.label, rest)
		if l < len(c.label) {
			c = t.splitLocked(n, i, c, l)
		}
		t.nodeBytes += c.addHolder(id, 0)
		c.lastUsed = now
		if c.heapIndex >= 0 {
			t.leaves.fix(int(c.heapIndex))
		}
		rest = rest[l:]
		n = c
	}
	n.keyEnd = true // splits put a node boundary wherever a key ends
	r := t.reachLocked(id)
	r.Taught += uint64(len(key))
	for end := uint64(len(key)); !n.isRoot(); n = n.parent {
		n.holders[n.holderIndex(id)].used = r.Taught - min(end, r.Taught)
		end -= uint64(len(n.label))
	}

	if t.maxBytes > 0 && t.bytesLocked() > t.maxBytes+t.maxBytes/overBudgetSlack {
		return t.evictLocked()
	}
	return 0
}

// spaceLocked returns the root of namespace ns, creating the namespace if it has none. A new
// root has no children yet: the caller must give it one before releasing the lock.
func (t *Tree) spaceLocked(ns string) *node {
	if root := t.spaces[ns]; root != nil {
		return root
	}
	root := &node{label: cloneLabel(ns), heapIndex: -1}
	t.spaces[root.label] = root
	t.spacesPeak = max(t.spacesPeak, len(t.spaces))
	t.nodeBytes += spaceCost(root)
	return root
}

// dropSpaceLocked removes the namespace of root, which has just lost its last child, and
// rebuilds the spaces map once it holds fewer than half its peak entries, so that the
// table of a map that once held many namespaces is not kept at its largest.
func (t *Tree) dropSpaceLocked(root *node) {
	t.nodeBytes -= spaceCost(root)
	delete(t.spaces, root.label)
	if t.spacesPeak >= minSpacesPeak && len(t.spaces) < t.spacesPeak/2 {
		spaces := make(map[string]*node, len(t.spaces))
		for ns, r := range t.spaces {
			spaces[ns] = r
		}
		t.spaces, t.spacesPeak = spaces, len(spaces)
	}
}

// unlinkLocked detaches the non-root node n from its parent and uncharges the parent's
// slices, then tidies the parent: a root left without children is dropped with its
// namespace, any other node left without children becomes a leaf.
func (t *Tree) unlinkLocked(n *node) {
	parent := n.parent
	t.nodeBytes -= parent.removeChild(n)
	switch {
	case len(parent.children) > 0:
	case parent.isRoot():
		t.dropSpaceLocked(parent)
	default:
		t.leaves.push(parent)
	}
}

// splitLocked cuts child c of parent (at position i) after its first l bytes and returns the
// new upper node, which takes c's place. Both halves get fresh label copies so neither keeps
// the other's bytes alive once one of them is gone.
func (t *Tree) splitLocked(parent *node, i int, c *node, l int) *node {
	before := c.heapBytes()
	upper := &node{
		label:     cloneLabel(c.label[:l]),
		parent:    parent,
		holders:   slices.Clone(c.holders),
		lastUsed:  c.lastUsed,
		heapIndex: -1,
	}
	c.label = cloneLabel(c.label[l:])
	upper.addChild(c) // charged below, with the rest of upper
	parent.children[i] = upper
	t.nodeBytes += upper.heapBytes() + c.heapBytes() - before
	return upper
}

// live reports whether h still counts: its tenant's cache reaches back to it.
func (t *Tree) live(h holder) bool {
	if t.bounded == 0 {
		return true
	}
	r := t.reach[h.id]
	return r.Horizon == 0 || r.Taught-h.used < r.Horizon
}

// reachLocked returns the reach of tenant id, growing the table for a new id.
func (t *Tree) reachLocked(id uint32) *Reach {
	if int(id) >= len(t.reach) {
		t.reach = append(t.reach, make([]Reach, int(id)+1-len(t.reach))...)
	}
	return &t.reach[id]
}

// heldLocked reports whether any holder of n still counts.
func (t *Tree) heldLocked(n *node) bool {
	if t.bounded == 0 {
		return true
	}
	for _, h := range n.holders {
		if t.live(h) {
			return true
		}
	}
	return false
}

// Holding is how many bytes of a key one tenant holds.
type Holding struct {
	Tenant tenant.ID
	Held   int
}

// Holdings appends to dst, for every tenant holding a prefix of key in namespace ns, how many
// bytes of key it holds, in one walk of the key's path; tenants holding none are left out.
func (t *Tree) Holdings(ns, key string, dst []Holding) []Holding {
	t.mu.RLock()
	defer t.mu.RUnlock()
	n := t.spaces[ns]
	if n == nil {
		return dst
	}
	// The path's nodes and the key bytes matched at the end of each.
	type step struct {
		n       *node
		matched int
	}
	var stack [32]step
	path := stack[:0]
	matched := 0
	rest := key
	for len(rest) > 0 {
		c, _ := n.child(rest[0])
		if c == nil || !t.heldLocked(c) {
			break
		}
		l := commonPrefixLen(c.label, rest)
		matched += l
		path = append(path, step{c, matched})
		if l < len(c.label) {
			break
		}
		rest = rest[l:]
		n = c
	}
	// Deepest first: a tenant's first appearance is the deepest node it holds, since the
	// holders of a node hold its parent too.
	var small [4]uint64
	seen := small[:]
	if words := len(t.tenantNames)/64 + 1; words > len(small) {
		seen = make([]uint64, words)
	}
	for i := len(path) - 1; i >= 0; i-- {
		for _, h := range path[i].n.holders {
			if bit := uint64(1) << (h.id % 64); seen[h.id/64]&bit == 0 && t.live(h) {
				seen[h.id/64] |= bit
				dst = append(dst, Holding{Tenant: t.tenantNames[h.id], Held: path[i].matched})
			}
		}
	}
	return dst
}

// Evicted records that tenant's cache no longer holds what it last used age ago (a
// Probe's Age): its holds that old or older stop counting in every lookup, until an
// Insert uses them again. The holds themselves stay until the tree evicts them.
func (t *Tree) Evicted(worker tenant.ID, age uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.tenantIDs[worker]
	if !ok {
		return
	}
	r := t.reachLocked(id)
	if r.Horizon == 0 {
		t.bounded++
	}
	if r.Horizon == 0 || age < r.Horizon {
		r.Horizon = max(1, age)
	}
}

// Kept records that tenant's cache reaches further back than its horizon said (it served more
// from cache than predicted): the horizon grows by a quarter.
func (t *Tree) Kept(worker tenant.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if id, ok := t.tenantIDs[worker]; ok && int(id) < len(t.reach) && t.reach[id].Horizon != 0 {
		r := &t.reach[id]
		r.Horizon += max(r.Horizon/4, 1)
	}
}

// ReachOf returns what the tree knows of tenant's cache.
func (t *Tree) ReachOf(worker tenant.ID) Reach {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if id, ok := t.tenantIDs[worker]; ok && int(id) < len(t.reach) {
		return t.reach[id]
	}
	return Reach{}
}

// Chars returns the number of key bytes stored in the tree, all namespaces together (the sum
// of its edge label lengths, namespace names not included): how much history it holds,
// whatever that costs in heap.
func (t *Tree) Chars() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.chars
}

// Bytes returns the heap the tree holds as the budget counts it: every node's struct, label
// and slice arrays at their capacity, each namespace's root and map entry, the leaf heap's
// array, and the interned tenant names.
func (t *Tree) Bytes() int {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.bytesLocked()
}

// bytesLocked adds to the bytes charged to nodes and tenants the arrays shared by all of
// them, at their capacity: the leaf heap and the tenant tables.
func (t *Tree) bytesLocked() int {
	return t.nodeBytes + t.tenantBytes + allocBytes(cap(t.leaves)*ptrBytes) +
		allocBytes(cap(t.tenantNames)*int(unsafe.Sizeof(""))) + allocBytes(cap(t.freeIDs)*idBytes) +
		allocBytes(cap(t.reach)*int(unsafe.Sizeof(Reach{})))
}

// Evict removes least recently used leaves, whichever namespace holds them, until the tree is
// within its budget and returns the bytes freed, as Bytes counts them. A namespace whose last
// leaf goes is dropped.
func (t *Tree) Evict() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.maxBytes <= 0 {
		return 0
	}
	return t.evictLocked()
}

func (t *Tree) evictLocked() int {
	start := t.bytesLocked()
	for t.bytesLocked() > t.maxBytes && len(t.leaves) > 0 {
		leaf := t.leaves[0]
		t.leaves.remove(leaf)
		t.unlinkLocked(leaf)
		t.nodeBytes -= leaf.heapBytes()
		t.chars -= len(leaf.label)
	}
	return start - t.bytesLocked()
}

// RemoveTenant drops tenant from every node of every namespace, prunes the nodes nobody holds
// any more (and the namespaces left empty) and returns the bytes freed, as Bytes counts them.
func (t *Tree) RemoveTenant(worker tenant.ID) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.tenantIDs[worker]
	if !ok {
		return 0
	}
	return t.removeIDsLocked([]uint32{id})
}

// RemoveTenantsWithBase drops every tenant named base or base+"@<rank>" (a removed worker
// together with all its data-parallel ranks) from every namespace and returns the bytes freed,
// as Bytes counts them. A tenant such as base+"x" or base+"x@0" is a different worker and is kept.
func (t *Tree) RemoveTenantsWithBase(base string) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	var ids []uint32
	for name, id := range t.tenantIDs {
		if tenant.HasBase(string(name), base) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return 0
	}
	return t.removeIDsLocked(ids)
}

// Release undoes what Insert(ns, key, tenant) taught, for a tenant that held the first held
// bytes of key before that Insert (as a Probe's Held reported them): the caller sent key to
// tenant, the attempt failed, and tenant should not be predicted to hold what it was never
// given. It returns the bytes freed, as Bytes counts them.
//
// Holding is per node, so Release works in nodes. It walks key's path in ns and takes
// tenant's hold off the first node of that path that begins at or after byte held of key,
// and off everything tenant holds below that node (a tenant that does not hold a node holds
// nothing below it); nodes left without holders are pruned, and the namespace with its last
// one. Nodes that begin before byte held keep tenant's hold, including one that straddles
// held: the Insert split the path wherever key left what tenant held before, so a node
// straddling held was not extended by that Insert but held by tenant through another key.
// Hence, when nothing else was inserted for tenant along key in between, a Probe of key finds
// tenant holding held bytes afterwards. held <= 0 takes every hold tenant has along key; held >= len(key)
// changes nothing. Other tenants' holds are untouched.
//
// Release undoes the hold, not everything the Insert did: a split it made stays (nodes are
// never merged back), access times it refreshed stay, and tenant stays interned until
// RemoveTenant; Bytes returns to its figure before the Insert when that Insert only added a
// tail below what tenant held. The tree is a prediction: if another key was inserted for
// tenant through key's path beyond byte held in between, its hold there goes too.
//
// Key-end markers need no clearing: a node that survives still has a holder, and every holder
// of a node holds the whole path down to it, so a marker left on a surviving node still marks
// a key the tree was given and that is held whole; markers on pruned nodes go with them.
func (t *Tree) Release(ns, key string, worker tenant.ID, held int) (freed int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	id, ok := t.tenantIDs[worker]
	n := t.spaces[ns]
	if !ok || n == nil || held >= len(key) {
		return 0
	}
	pos, rest := 0, key
	for len(rest) > 0 {
		c, _ := n.child(rest[0])
		if c == nil || !c.holds(id) {
			return 0 // tenant holds nothing further along key
		}
		if pos >= held {
			start := t.bytesLocked()
			t.dropHoldsLocked([]*node{c}, []uint32{id})
			return start - t.bytesLocked()
		}
		l := commonPrefixLen(c.label, rest)
		if l < len(c.label) {
			return 0 // key ends or leaves the tree inside c, which begins before held
		}
		pos += l
		rest = rest[l:]
		n = c
	}
	return 0
}

// removeIDsLocked visits exactly the nodes held by any of ids (holders are closed under
// taking prefixes, so the walk never needs to enter a subtree the tenants do not hold),
// drops the ids there and prunes every node left without holders, in every namespace. The ids
// are then freed.
func (t *Tree) removeIDsLocked(ids []uint32) int {
	start := t.bytesLocked()
	var stack []*node
	for _, root := range t.spaces {
		stack = t.heldChildren(stack, root, ids)
	}
	t.dropHoldsLocked(stack, ids)
	for _, id := range ids {
		name := t.tenantNames[id]
		delete(t.tenantIDs, name)
		t.tenantBytes -= tenantCost(name)
		t.tenantNames[id] = ""
		t.freeIDs = append(t.freeIDs, id)
		if int(id) < len(t.reach) {
			if t.reach[id].Horizon != 0 {
				t.bounded--
			}
			t.reach[id] = Reach{}
		}
	}
	return start - t.bytesLocked()
}

// dropHoldsLocked drops ids from every node of stack, each held by one of ids, and from
// every node below them that ids hold, and prunes every node left without holders.
func (t *Tree) dropHoldsLocked(stack []*node, ids []uint32) {
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		t.nodeBytes -= n.dropHolders(ids)
		if len(n.holders) > 0 {
			stack = t.heldChildren(stack, n, ids)
			continue
		}
		// Nobody holds n, so nobody holds anything below it either. Its leaves leave the heap
		// before its parent may join it, so the heap's array never grows on the way.
		t.dropSubtreeLocked(n)
		t.unlinkLocked(n)
	}
}

func (t *Tree) heldChildren(stack []*node, n *node, ids []uint32) []*node {
	for _, c := range n.children {
		if c.holdsAny(ids) {
			stack = append(stack, c)
		}
	}
	return stack
}

// dropSubtreeLocked takes every leaf of the subtree of n (n included) out of the heap and
// uncharges every node of it; the caller unlinks n.
func (t *Tree) dropSubtreeLocked(n *node) {
	stack := []*node{n}
	for len(stack) > 0 {
		m := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		t.chars -= len(m.label)
		t.nodeBytes -= m.heapBytes()
		if m.heapIndex >= 0 {
			t.leaves.remove(m)
		}
		stack = append(stack, m.children...)
	}
}

// internLocked returns tenant's id, assigning one (reusing ids of removed tenants) if new.
func (t *Tree) internLocked(worker tenant.ID) uint32 {
	if id, ok := t.tenantIDs[worker]; ok {
		return id
	}
	worker = tenant.ID(strings.Clone(string(worker)))
	var id uint32
	if n := len(t.freeIDs); n > 0 {
		id = t.freeIDs[n-1]
		t.freeIDs = t.freeIDs[:n-1]
		t.tenantNames[id] = worker
	} else {
		id = uint32(len(t.tenantNames))
		t.tenantNames = append(t.tenantNames, worker)
	}
	t.tenantIDs[worker] = id
	t.tenantBytes += tenantCost(worker)
	return id
}
