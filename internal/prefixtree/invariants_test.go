package prefixtree

import (
	"fmt"
	"testing"
)

// checkInvariants walks the whole tree and fails the test if any structural invariant
// documented on node is broken, or if the char count, the heap charge or the leaf heap
// disagree with the tree.
func checkInvariants(t testing.TB, tr *Tree) {
	t.Helper()
	tr.mu.RLock()
	defer tr.mu.RUnlock()
	if err := invariantError(tr); err != nil {
		t.Fatal(err)
	}
}

func invariantError(tr *Tree) error {
	chars, leaves := 0, 0
	// The heap charge, recomputed from scratch: it must equal the one kept up to date by every
	// mutation, or the budget drifts away from the memory it bounds.
	nodeBytes := 0
	var stack []*node
	if tr.spacesPeak < len(tr.spaces) {
		return fmt.Errorf("%d namespaces but a peak of %d", len(tr.spaces), tr.spacesPeak)
	}
	for ns, root := range tr.spaces {
		switch {
		case root == nil:
			return fmt.Errorf("namespace %q has no root", ns)
		case root.label != ns:
			return fmt.Errorf("namespace %q has a root labelled %q", ns, root.label)
		case root.parent != nil || len(root.holders) > 0 || root.heapIndex != -1 || root.keyEnd:
			return fmt.Errorf("root of namespace %q has a parent, holders, a heap index or a key end", ns)
		case len(root.children) == 0:
			return fmt.Errorf("namespace %q is empty but kept", ns)
		}
		// A root is charged like any node, plus its map entry.
		nodeBytes += root.heapBytes() + spaceEntryBytes
		stack = append(stack, root)
	}
	for len(stack) > 0 {
		n := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		if len(n.edges) != len(n.children) {
			return fmt.Errorf("node %q: %d edges for %d children", n.label, len(n.edges), len(n.children))
		}
		seen := map[byte]bool{}
		for i, c := range n.children {
			if c.parent != n {
				return fmt.Errorf("child %q of %q has the wrong parent", c.label, n.label)
			}
			if c.label == "" {
				return fmt.Errorf("child of %q has an empty label", n.label)
			}
			if n.edges[i] != c.label[0] {
				return fmt.Errorf("edge byte %q does not start child %q", n.edges[i], c.label)
			}
			if seen[c.label[0]] {
				return fmt.Errorf("node %q has two children starting with %q", n.label, c.label[0])
			}
			seen[c.label[0]] = true
			if len(c.holders) == 0 {
				return fmt.Errorf("node %q has no holders", c.label)
			}
			for _, h := range c.holders {
				if int(h.id) >= len(tr.tenantNames) {
					return fmt.Errorf("node %q is held by unknown tenant id %d", c.label, h.id)
				}
				if id, ok := tr.tenantIDs[tr.tenantNames[h.id]]; !ok || id != h.id {
					return fmt.Errorf("node %q is held by unknown tenant id %d", c.label, h.id)
				}
				if n.isRoot() {
					continue
				}
				i := n.holderIndex(h.id)
				if i < 0 {
					return fmt.Errorf("node %q is held by %q but its parent %q is not", c.label, tr.tenantNames[h.id], n.label)
				}
				if h.used > n.holders[i].used {
					return fmt.Errorf("%q used node %q after its parent %q", tr.tenantNames[h.id], c.label, n.label)
				}
			}
			if c.lastUsed > n.lastUsed && !n.isRoot() {
				return fmt.Errorf("node %q was used after its parent %q", c.label, n.label)
			}
			stack = append(stack, c)
		}
		if n.isRoot() {
			continue
		}
		chars += len(n.label)
		nodeBytes += n.heapBytes()
		isLeaf := len(n.children) == 0
		if isLeaf {
			leaves++
		}
		switch {
		case isLeaf && (n.heapIndex < 0 || int(n.heapIndex) >= len(tr.leaves) || tr.leaves[n.heapIndex] != n):
			return fmt.Errorf("leaf %q is not in the leaf heap", n.label)
		case !isLeaf && n.heapIndex != -1:
			return fmt.Errorf("inner node %q has heap index %d", n.label, n.heapIndex)
		}
	}
	if chars != tr.chars {
		return fmt.Errorf("tree stores %d bytes but counts %d", chars, tr.chars)
	}
	if nodeBytes != tr.nodeBytes {
		return fmt.Errorf("nodes cost %d heap bytes but the tree charges %d", nodeBytes, tr.nodeBytes)
	}
	if leaves != len(tr.leaves) {
		return fmt.Errorf("tree has %d leaves but the heap has %d", leaves, len(tr.leaves))
	}
	for i := 1; i < len(tr.leaves); i++ {
		if tr.leaves.less(i, (i-1)/2) {
			return fmt.Errorf("leaf heap out of order at %d", i)
		}
	}
	tenantBytes := 0
	for name, id := range tr.tenantIDs {
		if tr.tenantNames[id] != name {
			return fmt.Errorf("tenant %q interned as %d, which names %q", name, id, tr.tenantNames[id])
		}
		tenantBytes += tenantCost(name)
	}
	if tenantBytes != tr.tenantBytes {
		return fmt.Errorf("tenants cost %d heap bytes but the tree charges %d", tenantBytes, tr.tenantBytes)
	}
	return nil
}
