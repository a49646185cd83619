package prefixtree

import (
	"slices"
	"testing"
)

func TestAllocBytes_MatchesTheRuntime(t *testing.T) {
	sizes := []int{0, 1, 2, 7, 100, 32761, 40000, 5 * largePageBytes, 5*largePageBytes + 1, 1<<20 + 3}
	for _, c := range sizeClasses {
		sizes = append(sizes, c-1, c, c+1)
	}
	for _, n := range sizes {
		// append rounds a new array up to what the allocator hands out, and says so in cap.
		if got, want := allocBytes(n), cap(slices.Grow([]byte(nil), n)); got != want {
			t.Errorf("allocBytes(%d) = %d, the runtime allocates %d", n, got, want)
		}
	}
}
