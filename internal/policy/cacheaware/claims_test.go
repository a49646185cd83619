package cacheaware

import (
	"fmt"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// A worker's count follows its claims as they are made, released, made again on another worker,
// and lapse, each claimTTL after it was last made.
func TestClaimsCountOnEachWorkerThroughReleaseRemakeAndLapse(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newClaims(func() time.Time { return now })
	const w1, w2 = tenant.ID("w1"), tenant.ID("w2")
	want := func(step string, on1, on2 int) {
		t.Helper()
		if got1, got2 := c.onWorker(w1), c.onWorker(w2); got1 != on1 || got2 != on2 {
			t.Fatalf("%s: %d and %d claims on w1 and w2, want %d and %d", step, got1, got2, on1, on2)
		}
	}
	c.add("a", w1)
	c.add("b", w1)
	c.add("c", w2)
	want("made", 2, 1)
	c.release("b")
	c.release("b") // released twice: counted once
	want("b released", 1, 1)
	now = now.Add(time.Second)
	c.add("a", w2) // made again, elsewhere
	want("a made again on w2", 0, 2)
	now = now.Add(claimTTL - time.Second)
	want("c lapsed", 0, 1)
	now = now.Add(time.Second - time.Nanosecond)
	want("a not yet lapsed", 0, 1)
	now = now.Add(time.Nanosecond)
	want("a lapsed", 0, 0)
	if len(c.by) != 0 || len(c.on) != 0 {
		t.Fatalf("%d claims and %d worker counts kept once all lapsed, want none", len(c.by), len(c.on))
	}
}

// Claims made and released faster than they lapse leave the record of their order bounded, and
// the claims no more than maxClaims.
func TestClaimsHoldBoundedStateUnderChurn(t *testing.T) {
	now := time.Unix(1000, 0)
	c := newClaims(func() time.Time { return now })
	for i := range 50_000 {
		key := fmt.Sprint(i)
		c.add(key, "w")
		if i%3 != 0 {
			c.release(key)
		}
		now = now.Add(time.Microsecond)
	}
	if len(c.made) > 2*maxClaims || len(c.by) > maxClaims {
		t.Fatalf("%d entries in the order record and %d claims, want at most %d and %d", len(c.made), len(c.by), 2*maxClaims, maxClaims)
	}
	if got := c.onWorker("w"); got != len(c.by) {
		t.Fatalf("%d claims counted on w, %d held", got, len(c.by))
	}
}
