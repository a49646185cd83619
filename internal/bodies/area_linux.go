package bodies

import (
	"os"
	"syscall"
)

// On Linux a body larger than smallBody is read into a private anonymous mapping of its largest
// size (its announced length, or --max-payload-size for a chunked body), reserved without
// backing: the kernel backs a page when its first byte is written, so the memory a body takes
// follows the bytes received, page by page, without the copies a growing buffer makes; and the
// mapping goes back to the system at once when the request ends, outside the Go heap and its
// collector's slack. Where a mapping cannot be made, the body goes on the heap.

var pageSize = os.Getpagesize()

// newBodyArea returns room for a body of at most limit bytes.
func newBodyArea(limit int) bodyArea {
	if limit > smallBody {
		b, err := syscall.Mmap(-1, 0, limit, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
		if err == nil {
			return bodyArea{b: b, limit: limit, mapped: true}
		}
	}
	return heapArea(limit)
}

// free gives the area's memory back: a mapping to the system at once, heap memory to the
// collector. Nothing may read the body afterwards.
func (a *bodyArea) free() {
	if a.mapped {
		_ = syscall.Munmap(a.b)
	}
	a.b, a.mapped = nil, false
}
