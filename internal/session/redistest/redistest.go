// Package redistest runs a real redis-server on a free loopback port for tests.
//
// When redis-server is not installed the test is skipped, unless the environment variable CI
// is set: CI installs it, so there its absence is a failure.
package redistest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// Server is one redis-server process, stopped and reaped when the test ends.
type Server struct {
	t    testing.TB
	bin  string
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	output *bytes.Buffer
	exited chan struct{}
}

// Start runs redis-server on a free 127.0.0.1 port, with no persistence, and waits until it
// answers PING.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatalf("redis-server not found in PATH, and CI is set: %v", err)
		}
		t.Skip("redis-server not installed (apt-get install redis-server); skipped outside CI")
	}
	s := &Server{t: t, bin: bin, dir: t.TempDir()}
	t.Cleanup(s.Stop)
	var lastErr error
	for range 5 { // another process may take the free port between probe and bind
		if s.port, err = freePort(); err != nil {
			t.Fatal(err)
		}
		if lastErr = s.start(); lastErr == nil {
			return s
		}
	}
	t.Fatalf("redis-server did not start: %v", lastErr)
	return nil
}

func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// start runs the process on s.port and waits until it answers, or fails.
func (s *Server) start() error {
	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--daemonize", "no", "--protected-mode", "yes")
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = sysProcAttr()
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	s.mu.Lock()
	s.cmd, s.output, s.exited = cmd, out, exited
	s.mu.Unlock()

	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: time.Second, ReadTimeout: time.Second, MaxRetries: -1})
	defer c.Close()
	for range 200 { // up to about 10 s
		select {
		case <-exited:
			return fmt.Errorf("redis-server exited: %s", strings.TrimSpace(s.Output()))
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		time.Sleep(50 * time.Millisecond)
	}
	s.Stop()
	return errors.New("redis-server did not answer PING within 10s")
}

// Addr is host:port of the server.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// URL is the redis:// URL of the server.
func (s *Server) URL() string { return "redis://" + s.Addr() }

// Pid is the process id of the running server, 0 when stopped.
func (s *Server) Pid() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Output is what the server printed so far.
func (s *Server) Output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.output == nil {
		return ""
	}
	return s.output.String()
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
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused process dies as well, but be explicit
	_ = cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		s.t.Errorf("redis-server pid %d did not exit after SIGKILL", cmd.Process.Pid)
	}
}

// Restart starts a new, empty server on the same port.
func (s *Server) Restart() {
	s.t.Helper()
	s.Stop()
	var err error
	for range 50 { // the port may take a moment to be free again
		if err = s.start(); err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("redis-server did not restart on port %d: %v", s.port, err)
}

// Pause stops the process with SIGSTOP: connections are still accepted by the kernel, but
// nothing is answered, as with a stalled server.
func (s *Server) Pause() { s.signal(syscall.SIGSTOP) }

// Resume continues a paused server.
func (s *Server) Resume() { s.signal(syscall.SIGCONT) }

// Paused reports whether the process is stopped by a signal (state T in /proc).
func (s *Server) Paused() bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(s.Pid()) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name in parentheses: "pid (comm) S ...".
	if i := bytes.LastIndexByte(b, ')'); i >= 0 && i+2 < len(b) {
		return b[i+2] == 'T' || b[i+2] == 't'
	}
	return false
}

func (s *Server) signal(sig syscall.Signal) {
	s.t.Helper()
	pid := s.Pid()
	if pid == 0 {
		s.t.Fatal("redis-server is not running")
	}
	if err := syscall.Kill(pid, sig); err != nil {
		s.t.Fatalf("signal %v to redis-server: %v", sig, err)
	}
}
