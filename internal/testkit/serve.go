package testkit

import (
	"net"
	"testing"
	"time"
)

// Listen returns a TCP listener on a free loopback port, closed when the test ends.
func Listen(t testing.TB) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return ln
}

// Go runs run in a goroutine and returns the channel its error arrives on. When the test ends it
// calls stop and waits up to 15 s for that error, failing t if none came; a test that took the
// error from the channel itself puts it back.
func Go(t testing.TB, stop func(), run func() error) chan error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- run() }()
	t.Cleanup(func() {
		stop()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			t.Error("did not stop within 15 s")
		}
	})
	return done
}

// FreePort returns a loopback TCP port that was free a moment ago, for a command that must be
// given the port it listens on.
func FreePort(t testing.TB) int {
	t.Helper()
	ln := Listen(t)
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}
