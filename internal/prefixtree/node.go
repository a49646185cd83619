package prefixtree

import (
	"bytes"
	"strings"
)

// node is one edge of the radix tree together with the vertex it leads to.
//
// Invariants (checked by the tests):
//   - every non-root node has a non-empty label, and edges[i] == children[i].label[0],
//     so the children of one node start with distinct bytes;
//   - every non-root node has at least one holder, and a node's holders are a subset of its
//     parent's holders (a tenant that holds a key holds every prefix of it);
//   - a non-root node without children sits in the leaf heap (heapIndex >= 0); every other
//     node has heapIndex == -1.
type node struct {
	// label is owned by the node: it is always a fresh copy, never a substring of a caller's
	// key, so a stored edge does not keep a whole request body alive.
	label    string
	parent   *node
	edges    []byte
	children []*node
	// holders are interned tenant ids, unsorted and without duplicates.
	holders []uint32
	// lastUsed is the tree clock at the last Insert whose key passed through this node.
	lastUsed  uint64
	heapIndex int32
	// keyEnd is set when some inserted key ended exactly at the end of this node's label: the
	// path to here is a whole key the tree was given, not only a prefix of one.
	keyEnd bool
}

// child returns the child whose label starts with b, with its position, or (nil, -1).
func (n *node) child(b byte) (*node, int) {
	i := bytes.IndexByte(n.edges, b)
	if i < 0 {
		return nil, -1
	}
	return n.children[i], i
}

func (n *node) addChild(c *node) {
	c.parent = n
	n.edges = append(n.edges, c.label[0])
	n.children = append(n.children, c)
}

// removeChild detaches c from n. Child order carries no meaning, so the last child takes
// c's place; the slices are released once empty so a pruned fan-out does not pin memory.
func (n *node) removeChild(c *node) {
	_, i := n.child(c.label[0])
	last := len(n.children) - 1
	n.children[i] = n.children[last]
	n.edges[i] = n.edges[last]
	n.children[last] = nil
	n.children = n.children[:last]
	n.edges = n.edges[:last]
	if last == 0 {
		n.children, n.edges = nil, nil
	}
	c.parent = nil
}

func (n *node) holds(id uint32) bool {
	for _, h := range n.holders {
		if h == id {
			return true
		}
	}
	return false
}

func (n *node) addHolder(id uint32) {
	if !n.holds(id) {
		n.holders = append(n.holders, id)
	}
}

// dropHolders removes every id in gone from n's holders and reports whether any was held.
func (n *node) dropHolders(gone []uint32) bool {
	kept := n.holders[:0]
	for _, h := range n.holders {
		if !containsID(gone, h) {
			kept = append(kept, h)
		}
	}
	changed := len(kept) != len(n.holders)
	clear(n.holders[len(kept):])
	n.holders = kept
	if len(n.holders) == 0 {
		n.holders = nil
	}
	return changed
}

func (n *node) holdsAny(ids []uint32) bool {
	for _, h := range n.holders {
		if containsID(ids, h) {
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
