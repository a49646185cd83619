package upstream

import (
	"testing"
	"time"
)

// The /tokenize timeout is the base plus the allowance for each KiB begun; without a base there
// is no bound.
func TestTokenizeForAddsTheAllowanceOfEachKiB(t *testing.T) {
	base, perKiB := 100*time.Millisecond, 500*time.Microsecond
	for size, want := range map[int]time.Duration{
		0:         base,
		1:         base + perKiB,
		1024:      base + perKiB,
		1025:      base + 2*perKiB,
		700 << 10: 450 * time.Millisecond,
	} {
		if got := (Timeouts{Tokenize: base, TokenizePerKiB: perKiB}).TokenizeFor(size); got != want {
			t.Errorf("%d bytes: %v, want %v", size, got, want)
		}
	}
	if got := (Timeouts{Tokenize: base}).TokenizeFor(32 << 20); got != base {
		t.Errorf("no allowance: %v, want %v", got, base)
	}
	if got := (Timeouts{TokenizePerKiB: perKiB}).TokenizeFor(32 << 20); got != 0 {
		t.Errorf("no base: %v, want no bound", got)
	}
}
