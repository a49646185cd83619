package testkit

import (
	"testing"
	"time"
)

// Patience is how long WaitFor waits: an upper bound on behaviour that a loaded machine still
// meets, never a performance target.
const Patience = 10 * time.Second

// WaitFor polls cond every 2 ms until it holds, failing t with what after Patience.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	WaitWithin(t, Patience, what, cond)
}

// WaitWithin polls cond every 2 ms until it holds, failing t with what once within has passed.
func WaitWithin(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %v: %s", within, what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}
