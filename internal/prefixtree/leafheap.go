package prefixtree

// leafHeap is a binary min-heap of the tree's leaves ordered by lastUsed, so eviction finds
// the least recently used leaf in O(log leaves) without scanning the tree. Each node records
// its own position (heapIndex), which lets Insert refresh or remove a leaf in place.
type leafHeap []*node

func (h leafHeap) less(i, j int) bool { return h[i].lastUsed < h[j].lastUsed }

func (h leafHeap) swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].heapIndex = int32(i)
	h[j].heapIndex = int32(j)
}

func (h *leafHeap) push(n *node) {
	n.heapIndex = int32(len(*h))
	*h = append(*h, n)
	h.up(len(*h) - 1)
}

// remove takes n out of the heap; n must be in it.
func (h *leafHeap) remove(n *node) {
	i := int(n.heapIndex)
	last := len(*h) - 1
	if i != last {
		h.swap(i, last)
	}
	(*h)[last] = nil
	*h = (*h)[:last]
	n.heapIndex = -1
	if i != last {
		h.fix(i)
	}
}

// fix restores the heap order after the key of the element at i changed.
func (h leafHeap) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

func (h leafHeap) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(i, parent) {
			return
		}
		h.swap(i, parent)
		i = parent
	}
}

// down sifts the element at i towards the leaves and reports whether it moved.
func (h leafHeap) down(i int) bool {
	start := i
	for {
		smallest := i
		left, right := 2*i+1, 2*i+2
		if left < len(h) && h.less(left, smallest) {
			smallest = left
		}
		if right < len(h) && h.less(right, smallest) {
			smallest = right
		}
		if smallest == i {
			return i != start
		}
		h.swap(i, smallest)
		i = smallest
	}
}
