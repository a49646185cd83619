package prefixtree

import "slices"

// sizeClasses are the Go allocator's size classes for small objects (internal/runtime/gc's
// SizeClassToSize): a small allocation takes the smallest class that fits it.
// TestAllocBytes_MatchesTheRuntime checks the table against the running runtime.
var sizeClasses = [...]int{
	8, 16, 24, 32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 224, 240, 256,
	288, 320, 352, 384, 416, 448, 480, 512, 576, 640, 704, 768, 896, 1024, 1152, 1280,
	1408, 1536, 1792, 2048, 2304, 2688, 3072, 3200, 3456, 4096, 4864, 5376, 6144, 6528,
	6784, 6912, 8192, 9472, 9728, 10240, 10880, 12288, 13568, 14336, 16384, 18432, 19072,
	20480, 21760, 24576, 27264, 28672, 32768,
}

// largePageBytes is the page size that allocations above the largest class round up to.
const largePageBytes = 8 << 10

// allocBytes is what an allocation of n bytes costs the heap: n rounded up to its size class,
// or to whole pages above the largest class. A label of 1,025 bytes takes 1,152, so charging
// len(label) alone would undercount long histories by several percent and short keys by more.
// Objects under 16 bytes without pointers may share a 16-byte block in the runtime's tiny
// allocator; charging them their class (8 or 16) errs on the side of the budget.
func allocBytes(n int) int {
	switch {
	case n <= 0:
		return 0
	case n > sizeClasses[len(sizeClasses)-1]:
		return (n + largePageBytes - 1) &^ (largePageBytes - 1)
	}
	i, _ := slices.BinarySearch(sizeClasses[:], n)
	return sizeClasses[i]
}
