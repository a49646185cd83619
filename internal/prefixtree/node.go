package prefixtree

import (
	"bytes"
	"strings"
	"unsafe"
)

// Heap sizes the budget charges, taken from the types so they follow the platform.
const (
	nodeStructBytes = int(unsafe.Sizeof(node{}))
	ptrBytes        = int(unsafe.Sizeof((*node)(nil)))
	idBytes         = int(unsafe.Sizeof(uint32(0)))
	holderBytes     = int(unsafe.Sizeof(holder{}))
)

// holder is one tenant holding a node, with the tree clock at the last Insert of that tenant
// through the node: what the tenant's own cache last used, which is what a least-recently-used
// cache evicts by.
type holder struct {
	id   uint32
	used uint64
}

// node is one edge of the radix tree together with the vertex it leads to, or the root of a
// namespace.
//
// Invariants (checked by the tests):
//   - a root has no parent, no holders and at least one child, and its label is the name of
//     its namespace: the key of its entry in Tree.spaces;
//   - every non-root node has a non-empty label, and edges[i] == children[i].label[0],
//     so the children of one node start with distinct bytes;
//   - every non-root node has at least one holder, and a node's holders are a subset of its
//     parent's holders (a tenant that holds a key holds every prefix of it), each with a
//     use stamp no later than its stamp on the parent;
//   - a non-root node without children sits in the leaf heap (heapIndex >= 0); every other
//     node has heapIndex == -1.
type node struct {
	// label is owned by the node: it is always a fresh copy, never a substring of a caller's
	// key, so a stored edge does not keep a whole request body alive.
	label    string
	parent   *node
	edges    []byte
	children []*node
	// holders are interned tenant ids with their last use, unsorted and without duplicate ids.
	holders []holder
	// lastUsed is the tree clock at the last Insert whose key passed through this node.
	lastUsed  uint64
	heapIndex int32
	// keyEnd is set when some inserted key ended exactly at the end of this node's label: the
	// path to here is a whole key the tree was given, not only a prefix of one.
	keyEnd bool
}

// heapBytes is what the node costs the heap: its struct, its label and the backing arrays of
// its slices at their capacity, each rounded up to the allocation it takes.
func (n *node) heapBytes() int {
	return allocBytes(nodeStructBytes) + allocBytes(len(n.label)) + n.sliceBytes()
}

// sliceBytes is the heap held by the backing arrays of the node's slices.
func (n *node) sliceBytes() int {
	return allocBytes(cap(n.edges)) + allocBytes(cap(n.children)*ptrBytes) + allocBytes(cap(n.holders)*holderBytes)
}

// isRoot reports whether n is the root of a namespace. Only meaningful for a node in the
// tree: a detached node has no parent either.
func (n *node) isRoot() bool { return n.parent == nil }

// child returns the child whose label starts with b, with its position, or (nil, -1).
func (n *node) child(b byte) (*node, int) {
	i := bytes.IndexByte(n.edges, b)
	if i < 0 {
		return nil, -1
	}
	return n.children[i], i
}

// addChild attaches c under n and returns how many bytes n's slices grew by.
func (n *node) addChild(c *node) (grown int) {
	before := n.sliceBytes()
	c.parent = n
	n.edges = append(n.edges, c.label[0])
	n.children = append(n.children, c)
	return n.sliceBytes() - before
}

// removeChild detaches c from n. Child order carries no meaning, so the last child takes
// c's place; the slices are released once empty so a pruned fan-out does not pin memory.
// It returns how many bytes of n's slices were released.
func (n *node) removeChild(c *node) (released int) {
	_, i := n.child(c.label[0])
	last := len(n.children) - 1
	n.children[i] = n.children[last]
	n.edges[i] = n.edges[last]
	n.children[last] = nil
	n.children = n.children[:last]
	n.edges = n.edges[:last]
	if last == 0 {
		released = allocBytes(cap(n.edges)) + allocBytes(cap(n.children)*ptrBytes)
		n.children, n.edges = nil, nil
	}
	c.parent = nil
	return released
}

func (n *node) holds(id uint32) bool { return n.holderIndex(id) >= 0 }

// holderIndex is the position of id among n's holders, or -1.
func (n *node) holderIndex(id uint32) int {
	for i, h := range n.holders {
		if h.id == id {
			return i
		}
	}
	return -1
}

// addHolder records that id used n at clock now and returns how many bytes the holders slice
// grew by.
func (n *node) addHolder(id uint32, now uint64) (grown int) {
	if i := n.holderIndex(id); i >= 0 {
		n.holders[i].used = now
		return 0
	}
	before := allocBytes(cap(n.holders) * holderBytes)
	n.holders = append(n.holders, holder{id: id, used: now})
	return allocBytes(cap(n.holders)*holderBytes) - before
}

// dropHolders removes every id in gone from n's holders and returns how many bytes of the
// holders slice were released: the slice moves to a smaller array once at most half of it is
// used, so a hold taken and released leaves the charge as it was, and is released with the
// last holder.
func (n *node) dropHolders(gone []uint32) (released int) {
	before := allocBytes(cap(n.holders) * holderBytes)
	kept := n.holders[:0]
	for _, h := range n.holders {
		if !containsID(gone, h.id) {
			kept = append(kept, h)
		}
	}
	clear(n.holders[len(kept):])
	switch {
	case len(kept) == 0:
		n.holders = nil
	case len(kept) <= cap(kept)/2:
		n.holders = append([]holder(nil), kept...)
	default:
		n.holders = kept
	}
	return before - allocBytes(cap(n.holders)*holderBytes)
}

func (n *node) holdsAny(ids []uint32) bool {
	for _, h := range n.holders {
		if containsID(ids, h.id) {
			return true
		}
	}
	return false
}

func containsID(ids []uint32, id uint32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// commonPrefixLen returns the length of the longest common prefix of a and b.
//
// Edge labels and keys are long (whole chat histories), so the common case — the key runs
// through the entire label — is answered by one string comparison, which the runtime does
// with vector instructions. Only on a mismatch does it narrow down, in coarse then fine
// blocks, to the first differing byte.
func commonPrefixLen(a, b string) int {
	n := min(len(a), len(b))
	a, b = a[:n], b[:n]
	if a == b {
		return n
	}
	i := 0
	for _, block := range [...]int{4096, 256, 16} {
		for n-i >= block && a[i:i+block] == b[i:i+block] {
			i += block
		}
	}
	for i < n && a[i] == b[i] {
		i++
	}
	return i
}

// cloneLabel copies s so the new node owns its bytes.
func cloneLabel(s string) string { return strings.Clone(s) }
