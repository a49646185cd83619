//go:build cacheroute_poison

package bodies

// poison.go is the test build of internal/proxy/poison.go (go test -tags cacheroute_poison): a
// small body's buffer is overwritten when the body is released, so that a value read from the
// body or its key and kept without a copy reads as garbage at once, instead of only once a later
// body lands in the same buffer.
func init() {
	poisonArea = func(b []byte) {
		for i := range b {
			b[i] = '#'
		}
	}
}
