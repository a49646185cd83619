// Package redistest runs a real redis-server on a free loopback port for tests, through
// internal/redisproc, and stops it when the test ends.
//
// When redis-server is not installed the test is skipped, unless the environment variable CI
// is set: CI installs it, so there its absence is a failure.
package redistest

import (
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheroute/cacheroute/internal/redisproc"
)

// Server is one redis-server process, stopped and reaped when the test ends.
type Server struct {
	*redisproc.Server
	t testing.TB
}

// Start runs redis-server on a free 127.0.0.1 port, with no persistence, and waits until it
// answers PING.
func Start(t testing.TB) *Server {
	t.Helper()
	Require(t)
	p, err := redisproc.Start(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	s := &Server{Server: p, t: t}
	t.Cleanup(s.Stop)
	return s
}

// Require skips the test when redis-server is not installed, or fails it when CI is set.
func Require(t testing.TB) {
	t.Helper()
	if _, err := redisproc.LookPath(); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("%v, and CI is set", err)
		}
		t.Skip("redis-server not installed (apt-get install redis-server); skipped outside CI")
	}
}

// Client is a client of the server with generous timeouts, closed when the test ends.
func (s *Server) Client() *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second})
	s.t.Cleanup(func() { _ = c.Close() })
	return c
}

// Stop kills the server (SIGKILL: an abrupt crash, nothing is saved) and reaps it. Stopping a
// stopped server does nothing.
func (s *Server) Stop() {
	if err := s.Server.Stop(); err != nil {
		s.t.Error(err)
	}
}

// Restart starts a new, empty server on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	if err := s.Server.Restart(); err != nil {
		s.t.Fatal(err)
	}
}

// Pause stops the process with SIGSTOP: connections are still accepted by the kernel, but
// nothing is answered, as with a stalled server.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	if err := s.Signal(sig); err != nil {
		s.t.Fatalf("signal %v to redis-server: %v", sig, err)
	}
}
