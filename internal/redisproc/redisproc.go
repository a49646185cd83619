// Package redisproc runs a real redis-server process on a free loopback port, with no
// persistence: the shared session store of test fleets (through internal/session/redistest) and
// of `cacheroute bench --replicas`. It finds redis-server on PATH; it never installs anything.
package redisproc

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
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheroute/cacheroute/internal/freeport"
)

// ErrNotInstalled is returned by Start when redis-server is not found on PATH.
var ErrNotInstalled = errors.New("redis-server not found in PATH (install it, e.g. apt-get install redis-server)")

// Server is one redis-server process bound to 127.0.0.1.
type Server struct {
	bin     string
	dir     string
	ownsDir bool // dir was made by Start and is removed by Close
	port    int

	mu     sync.Mutex
	cmd    *exec.Cmd
	output *bytes.Buffer
	exited chan struct{}
}

// LookPath returns the path of redis-server, or an error wrapping ErrNotInstalled.
func LookPath() (string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return "", fmt.Errorf("%w: %v", ErrNotInstalled, err)
	}
	return bin, nil
}

// Start runs redis-server on a free 127.0.0.1 port, saving nothing (no RDB snapshots, no
// append-only file), and waits until it answers PING. dir is its working directory; with ""
// Start makes a temporary one that Close removes.
func Start(dir string) (*Server, error) {
	bin, err := LookPath()
	if err != nil {
		return nil, err
	}
	s := &Server{bin: bin, dir: dir}
	if dir == "" {
		if s.dir, err = os.MkdirTemp("", "cacheroute-redis-"); err != nil {
			return nil, err
		}
		s.ownsDir = true
	}
	var lastErr error
	for range 5 { // another process may take the free port between probe and bind
		if s.port, err = freeport.Port(); err != nil {
			s.Close()
			return nil, err
		}
		if lastErr = s.start(); lastErr == nil {
			return s, nil
		}
	}
	s.Close()
	return nil, fmt.Errorf("redis-server did not start: %w", lastErr)
}

// start runs the process on s.port and waits until it answers, or fails.
func (s *Server) start() error {
	cmd := exec.Command(s.bin,
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", s.dir,
		"--daemonize", "no", "--protected-mode", "yes")
	out := &bytes.Buffer{}
	cmd.Stdout, cmd.Stderr = &lockedWriter{mu: &s.mu, w: out}, &lockedWriter{mu: &s.mu, w: out}
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
	_ = s.Stop()
	return errors.New("redis-server did not answer PING within 10s")
}

// lockedWriter serialises the process's output with readers of Output.
type lockedWriter struct {
	mu *sync.Mutex
	w  *bytes.Buffer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
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

// FlushAll empties every database of the server.
func (s *Server) FlushAll(ctx context.Context) error {
	c := redis.NewClient(&redis.Options{Addr: s.Addr(), DialTimeout: 5 * time.Second, ReadTimeout: 5 * time.Second})
	defer c.Close()
	return c.FlushAll(ctx).Err()
}

// Stop kills the server (SIGKILL: an abrupt crash, nothing is saved) and reaps it. Stopping a
// stopped server does nothing. It fails only when the process outlives SIGKILL by 10 s.
func (s *Server) Stop() error {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.cmd = nil
	s.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(syscall.SIGCONT) // a paused process dies as well, but be explicit
	_ = cmd.Process.Kill()
	select {
	case <-exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("redis-server pid %d did not exit after SIGKILL", cmd.Process.Pid)
	}
}

// Close stops the server and removes the working directory Start made for it.
func (s *Server) Close() error {
	err := s.Stop()
	if s.ownsDir {
		if rerr := os.RemoveAll(s.dir); err == nil {
			err = rerr
		}
	}
	return err
}

// Restart starts a new, empty server on the same port, retrying while the port is still taken.
func (s *Server) Restart() error {
	if err := s.Stop(); err != nil {
		return err
	}
	var err error
	for range 50 { // the port may take a moment to be free again
		if err = s.start(); err == nil {
			return nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("redis-server did not restart on port %d: %w", s.port, err)
}

// Signal sends sig to the running server.
func (s *Server) Signal(sig syscall.Signal) error {
	pid := s.Pid()
	if pid == 0 {
		return errors.New("redis-server is not running")
	}
	return syscall.Kill(pid, sig)
}

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
