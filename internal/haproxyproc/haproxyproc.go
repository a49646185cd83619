// Package haproxyproc runs a real HAProxy process on a free loopback port in front of a list of
// workers, as a sticky proxy: a stick table on a request header keeps each session on the worker
// its first request was balanced to (round robin), the way HAProxy is deployed in front of
// inference servers without a cache-aware router. `cacheroute bench` runs one as a front to
// compare with its routers. It finds haproxy on PATH; it never installs anything.
package haproxyproc

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cacheroute/cacheroute/internal/freeport"
)

// ErrNotInstalled is returned by Start when haproxy is not found on PATH.
var ErrNotInstalled = errors.New("haproxy not found in PATH (install it, e.g. apt-get install haproxy)")

// Config is what the proxy does.
type Config struct {
	// Workers are the base URLs of the backends (http://host:port, loopback).
	Workers []string
	// StickHeader names the request header whose value keeps a session on its worker; empty
	// balances every request round robin.
	StickHeader string
	// Timeout bounds a request's answer (HAProxy's timeout server and client).
	Timeout time.Duration
}

// Proxy is one haproxy process bound to 127.0.0.1.
type Proxy struct {
	dir  string
	port int

	mu     sync.Mutex
	cmd    *exec.Cmd
	output bytes.Buffer
	exited chan struct{}
}

// startWait bounds how long Start waits for the proxy to accept connections.
const startWait = 10 * time.Second

// Start writes the configuration and runs haproxy in the foreground on a free loopback port,
// returning once the port accepts connections.
func Start(c Config) (*Proxy, error) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNotInstalled, err)
	}
	dir, err := os.MkdirTemp("", "cacheroute-haproxy-")
	if err != nil {
		return nil, err
	}
	p := &Proxy{dir: dir}
	var lastErr error
	for range 5 { // another process may take the free port between probe and bind
		if p.port, err = freeport.Port(); err != nil {
			break
		}
		if lastErr = p.start(bin, c); lastErr == nil {
			return p, nil
		}
	}
	p.Close()
	if err != nil {
		return nil, err
	}
	return nil, fmt.Errorf("haproxy did not start: %w", lastErr)
}

// config renders the haproxy configuration: one frontend on the loopback port, one backend of
// the workers balanced round robin, with the stick table when a header is named.
func (p *Proxy) config(c Config) (string, error) {
	if len(c.Workers) == 0 {
		return "", errors.New("no worker")
	}
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = time.Hour
	}
	var b strings.Builder
	fmt.Fprintf(&b, "global\n  maxconn 4096\n\n")
	// http-no-delay: forward every piece of a streamed answer at once (an SSE token is a few
	// bytes), instead of merging small sends, which holds a stream's tokens back.
	fmt.Fprintf(&b, "defaults\n  mode http\n  option http-no-delay\n  timeout connect 5s\n  timeout client %dms\n  timeout server %dms\n  timeout http-request 60s\n\n",
		timeout.Milliseconds(), timeout.Milliseconds())
	fmt.Fprintf(&b, "frontend front\n  bind 127.0.0.1:%d\n  default_backend workers\n\n", p.port)
	fmt.Fprintf(&b, "backend workers\n  balance roundrobin\n")
	if c.StickHeader != "" {
		if strings.ContainsAny(c.StickHeader, " \t\n()\"'") {
			return "", fmt.Errorf("stick header %q is not a header name", c.StickHeader)
		}
		fmt.Fprintf(&b, "  stick-table type string len 256 size 1m expire 24h\n  stick on req.hdr(%s)\n", c.StickHeader)
	}
	for i, w := range c.Workers {
		u, err := url.Parse(w)
		if err != nil || u.Scheme != "http" || u.Host == "" {
			return "", fmt.Errorf("worker %q: want http://host:port", w)
		}
		host, _, err := net.SplitHostPort(u.Host)
		if err != nil {
			return "", fmt.Errorf("worker %q: want http://host:port", w)
		}
		if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
			return "", fmt.Errorf("worker %q: the proxy fronts loopback workers only", w)
		}
		fmt.Fprintf(&b, "  server w%d %s\n", i, u.Host)
	}
	return b.String(), nil
}

// start runs the process on p.port and waits until it accepts connections, or fails.
func (p *Proxy) start(bin string, c Config) error {
	cfg, err := p.config(c)
	if err != nil {
		return err
	}
	path := filepath.Join(p.dir, "haproxy.cfg")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		return err
	}
	cmd := exec.Command(bin, "-db", "-f", path)
	cmd.Stdout, cmd.Stderr = &lockedWriter{p}, &lockedWriter{p}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	p.mu.Lock()
	p.cmd, p.exited = cmd, exited
	p.mu.Unlock()
	deadline := time.Now().Add(startWait)
	for time.Now().Before(deadline) {
		select {
		case <-exited:
			return fmt.Errorf("haproxy exited: %s", strings.TrimSpace(p.Output()))
		default:
		}
		if conn, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
			conn.Close()
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	p.stop()
	return fmt.Errorf("haproxy did not accept connections within %v", startWait)
}

// lockedWriter collects the process's output.
type lockedWriter struct{ p *Proxy }

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.p.mu.Lock()
	defer l.p.mu.Unlock()
	if l.p.output.Len() > 64<<10 {
		return len(b), nil // bounded: the start of the output is what explains a failure
	}
	return l.p.output.Write(b)
}

// Addr is host:port of the proxy.
func (p *Proxy) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(p.port)) }

// URL is the proxy's base URL.
func (p *Proxy) URL() string { return "http://" + p.Addr() }

// PID is the process id of the running haproxy (0 once stopped), so that a caller can read what
// it costs from /proc.
func (p *Proxy) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// Output is what haproxy printed so far.
func (p *Proxy) Output() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.output.String()
}

// stop kills the process and reaps it, waiting at most 10 s.
func (p *Proxy) stop() {
	p.mu.Lock()
	cmd, exited := p.cmd, p.exited
	p.cmd = nil
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Kill()
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
	}
}

// Close stops the proxy and removes its configuration.
func (p *Proxy) Close() {
	p.stop()
	os.RemoveAll(p.dir)
}
