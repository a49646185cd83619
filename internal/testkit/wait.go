package testkit

import (
	"testing"
	"time"
)

// Patience is how long WaitFor waits: an upper bound on behaviour that a loaded machine still
// meets, never a performance target.
const Patience = 10 * time.Second

// WaitFor polls cond every 5 ms until it holds, failing t with what after Patience.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	WaitWithin(t, Patience, what, cond)
}

// WaitWithin polls cond every 5 ms until it holds, failing t with what once within has passed.
func WaitWithin(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	if !Poll(within, 5*time.Millisecond, cond) {
		t.Fatalf("not within %v: %s", within, what)
	}
}

// Poll calls cond every interval until it holds, and reports whether it did before within had
// passed: for a test that fails with its own message, or whose cond does something each time.
func Poll(within, interval time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(interval)
	}
	return true
}
