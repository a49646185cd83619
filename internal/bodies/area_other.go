//go:build !linux

package bodies

import "os"

// Elsewhere than on Linux every body is read into heap memory (heapArea); a body larger than
// smallBody grows by doubling as it arrives, and the buffers it outgrew wait for the collector.

var pageSize = os.Getpagesize()

// newBodyArea returns room for a body of at most limit bytes.
func newBodyArea(limit int) bodyArea { return heapArea(limit) }

// free gives the area's memory back to the collector.
func (a *bodyArea) free() { a.b = nil }
