package bodies

import (
	"math/bits"
	"os"
	"sync"
	"syscall"
)

// On Linux a body larger than smallBody is read into a private anonymous mapping at least its
// largest size (its announced length, or --max-payload-size for a chunked body), reserved
// without backing: the kernel backs a page when its first byte is written, so the memory a body
// takes follows the bytes received, page by page, without the copies a growing buffer makes,
// and outside the Go heap and its collector's slack. Where a mapping cannot be made, the body
// goes on the heap.
//
// A mapping given back is kept for the next body that fits in it (spares), up to maxSpares of
// them holding at most maxSpareBytes of backed pages together, and unmapped past that. Unmapping
// on every request cost more than reading the body: the kernel shoots the mapping's pages out of
// every core's TLB (0.75 ms per 100 KB body on a two-core virtual machine), and the next body
// faults its pages in again.

var pageSize = os.Getpagesize()

// Bounds of the mappings kept for reuse: their number, and their backed pages together.
const (
	maxSpares     = 64
	maxSpareBytes = 32 << 20
)

// spares are mappings given back, kept for the next bodies.
type spares struct {
	mu     sync.Mutex
	areas  []bodyArea
	backed int // bytes of backed pages the areas hold together
}

// take returns room for a body of at most limit bytes: a spare mapping that fits, else a new
// one (sized to a power of two, so that it fits more of the bodies that follow), else heap memory.
// A mapping also has room for derivedRoom times the body after it, for Scratch: only the pages
// written are memory.
func (s *spares) take(limit int) bodyArea {
	if limit <= smallBody {
		return heapArea(limit)
	}
	need := limit + derivedRoom*limit // the body, then what routing derives from it (Scratch)
	s.mu.Lock()
	best := -1
	for i, a := range s.areas {
		if len(a.b) >= need && (best < 0 || len(a.b) < len(s.areas[best].b)) {
			best = i
		}
	}
	if best >= 0 {
		a := s.areas[best]
		s.areas[best] = s.areas[len(s.areas)-1]
		s.areas = s.areas[:len(s.areas)-1]
		s.backed -= a.backed
		s.mu.Unlock()
		a.limit = limit
		return a
	}
	s.mu.Unlock()
	size := 1 << bits.Len(uint(need-1))
	if size < need { // past the largest power of two an int holds
		size = need
	}
	b, err := syscall.Mmap(-1, 0, size, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON|syscall.MAP_NORESERVE)
	if err != nil {
		return heapArea(limit)
	}
	return bodyArea{b: b, limit: limit, mapped: true}
}

// give takes back an area: a mapping is kept while the spares' bounds allow, else unmapped; heap
// memory goes to the collector. Nothing may read the body afterwards.
func (s *spares) give(a *bodyArea) {
	if a.mapped {
		s.mu.Lock()
		if len(s.areas) < maxSpares && s.backed+a.backed <= maxSpareBytes {
			s.areas = append(s.areas, *a)
			s.backed += a.backed
			s.mu.Unlock()
		} else {
			s.mu.Unlock()
			_ = syscall.Munmap(a.b)
		}
	}
	*a = bodyArea{}
}
