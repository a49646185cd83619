//go:build !linux

package bodies

import "os"

// Elsewhere than on Linux every body is read into heap memory (heapArea); a body larger than
// smallBody grows by doubling as it arrives, and the buffers it outgrew wait for the collector.

var pageSize = os.Getpagesize()

// spares has nothing to keep where bodies live on the heap.
type spares struct{}

// take returns room for a body of at most limit bytes.
func (*spares) take(limit int) bodyArea { return heapArea(limit) }

// give gives the area's memory back to the collector.
func (*spares) give(a *bodyArea) { *a = bodyArea{} }
