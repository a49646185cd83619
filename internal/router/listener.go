package router

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// capListener accepts at most limit open connections at a time. A connection over the limit is
// answered 503 at once and closed, rather than left waiting in the accept queue where it would
// starve the clients that are within the limit.
func capListener(ln net.Listener, limit int) net.Listener {
	return &cappedListener{Listener: ln, limit: int64(limit)}
}

type cappedListener struct {
	net.Listener
	limit int64
	open  atomic.Int64
}

const overCapResponse = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nConnection: close\r\nContent-Length: 32\r\n\r\ntoo many connections; try again\n"

func (l *cappedListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.open.Add(1) > l.limit {
			l.open.Add(-1)
			go refuse(c)
			continue
		}
		return &countedConn{Conn: c, l: l}, nil
	}
}

func refuse(c net.Conn) {
	_ = c.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Write([]byte(overCapResponse))
	_ = c.Close()
}

type countedConn struct {
	net.Conn
	l      *cappedListener
	closed atomic.Bool
}

func (c *countedConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.open.Add(-1)
	}
	return c.Conn.Close()
}

// retryAccept keeps a listener serving through accept errors that pass: out of file descriptors
// (EMFILE, ENFILE), or a connection aborted before it was accepted. The server would otherwise
// take them as fatal and the router would exit; instead it waits, a little longer each time up to
// a second, and the connections in the backlog are accepted once descriptors free up. Such errors
// are logged at most once a second.
func retryAccept(ln net.Listener, log *slog.Logger) net.Listener {
	return &retryingListener{Listener: ln, log: log}
}

type retryingListener struct {
	net.Listener
	log       *slog.Logger
	lastLog   atomic.Int64
	backoffNs atomic.Int64
}

func (l *retryingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err == nil {
			l.backoffNs.Store(0)
			return c, nil
		}
		if !errors.Is(err, syscall.EMFILE) && !errors.Is(err, syscall.ENFILE) && !errors.Is(err, syscall.ECONNABORTED) {
			return nil, err
		}
		wait := min(max(2*time.Duration(l.backoffNs.Load()), 5*time.Millisecond), time.Second)
		l.backoffNs.Store(int64(wait))
		if now := time.Now().UnixNano(); now-l.lastLog.Load() > int64(time.Second) {
			l.lastLog.Store(now)
			l.log.Warn("accepting connections failed; retrying", "error", err, "retry_in", wait)
		}
		time.Sleep(wait)
	}
}

// capPerClient accepts at most limit open connections from one client address: an IPv4
// address, or an IPv6 /64, the block one host is usually given. A connection over it is answered
// 429 with Retry-After and closed, before any request is read; over TLS (tls true) it is closed
// without a handshake, which would cost more than the connection is worth. A client address is
// forgotten with its last connection, so the listener holds one entry per address with a
// connection open.
func capPerClient(ln net.Listener, limit int, tls bool) net.Listener {
	return &perClientListener{Listener: ln, limit: limit, tls: tls, open: map[netip.Prefix]int{}, refusing: make(chan struct{}, maxRefusing)}
}

type perClientListener struct {
	net.Listener
	limit    int
	tls      bool
	mu       sync.Mutex
	open     map[netip.Prefix]int
	refusing chan struct{} // a place per refusal being written
}

// maxRefusing bounds the refusals written at once; past it a connection over its client's cap
// is closed without one.
const maxRefusing = 64

// overClientCapResponse is the refusal: 429 with an OpenAI-shaped error body, which every client
// of either protocol reads as "too many requests, retry later".
var overClientCapResponse = func() string {
	body := `{"error":{"message":"too many open connections from this address; try again","type":"rate_limit_error","code":"too_many_connections"}}` + "\n"
	return "HTTP/1.1 429 Too Many Requests\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

func (l *perClientListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		key, ok := clientPrefix(c.RemoteAddr())
		if !ok { // not a TCP peer: nothing to count it by
			return c, nil
		}
		l.mu.Lock()
		if l.open[key] >= l.limit {
			l.mu.Unlock()
			l.refuse(c)
			continue
		}
		l.open[key]++
		l.mu.Unlock()
		return &clientConn{Conn: c, l: l, key: key}, nil
	}
}

// refuse answers a connection over its client's cap off the accept loop, or closes it when
// too many refusals are being written already.
func (l *perClientListener) refuse(c net.Conn) {
	if l.tls {
		_ = c.Close()
		return
	}
	select {
	case l.refusing <- struct{}{}:
		go func() {
			defer func() { <-l.refusing }()
			_ = c.SetWriteDeadline(time.Now().Add(time.Second))
			_, _ = c.Write([]byte(overClientCapResponse))
			_ = c.Close()
		}()
	default:
		_ = c.Close()
	}
}

func (l *perClientListener) closed(key netip.Prefix) {
	l.mu.Lock()
	if l.open[key]--; l.open[key] <= 0 {
		delete(l.open, key)
	}
	l.mu.Unlock()
}

// clientPrefix is what a peer's connections are counted by: its IPv4 address, or its IPv6 /64.
func clientPrefix(a net.Addr) (netip.Prefix, bool) {
	ta, ok := a.(*net.TCPAddr)
	if !ok {
		return netip.Prefix{}, false
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ip = ip.Unmap()
	bits := 32
	if ip.Is6() {
		bits = 64
	}
	p, err := ip.Prefix(bits)
	return p, err == nil
}

// clientConn gives its place back on its first Close. It exposes the socket's SyscallConn, so
// the proxy can still see a client that closed its connection.
type clientConn struct {
	net.Conn
	l      *perClientListener
	key    netip.Prefix
	closed atomic.Bool
}

func (c *clientConn) Close() error {
	if c.closed.CompareAndSwap(false, true) {
		c.l.closed(c.key)
	}
	return c.Conn.Close()
}

func (c *clientConn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}
