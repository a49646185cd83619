package proxy

import (
	"bytes"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
)

// RecordRequestStarts wraps the traffic listener's connections (over TLS, when it serves TLS) so
// that each keeps the first bytes of the request it is reading: a request whose headers are too
// large for fasthttp to parse is then still answered in the error shape of the route its request
// line names (431 on /v1/messages in Anthropic's shape), rather than always in OpenAI's.
func RecordRequestStarts(ln net.Listener) net.Listener { return startListener{ln} }

type startListener struct{ net.Listener }

func (l startListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	sc := &startConn{Conn: c}
	sc.fresh.Store(true)
	if tc, ok := c.(tlsConn); ok { // fasthttp tells TLS by these methods; keep them visible
		return &startTLSConn{startConn: sc, tls: tc}, nil
	}
	return sc, nil
}

// requestStartLen is how much of a request's start is kept: a request line with any routed path.
const requestStartLen = 256

// startConn keeps the first bytes read after each answer began (or after the accept): the start
// of the next request for a client that waits for each answer before it sends the next request.
// A pipelined request that arrives with the one before it is not seen, and its error answer
// takes the earlier request's shape.
type startConn struct {
	net.Conn
	fresh atomic.Bool // the next read begins a request
	mu    sync.Mutex
	n     int
	start [requestStartLen]byte
}

func (c *startConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.fresh.CompareAndSwap(true, false) {
		c.mu.Lock()
		c.n = copy(c.start[:], p[:n])
		c.mu.Unlock()
	}
	return n, err
}

func (c *startConn) Write(p []byte) (int, error) {
	c.fresh.Store(true)
	return c.Conn.Write(p)
}

// requestPath is the path of the request line the connection's current request began with; ""
// when the line was not seen whole.
func (c *startConn) requestPath() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return requestLinePath(c.start[:c.n])
}

// SyscallConn is the socket's, so that the proxy still sees a client that closed its connection.
func (c *startConn) SyscallConn() (syscall.RawConn, error) {
	inner := c.Conn
	if tc, ok := inner.(*tls.Conn); ok {
		inner = tc.NetConn()
	}
	sc, ok := inner.(syscall.Conn)
	if !ok {
		return nil, errors.ErrUnsupported
	}
	return sc.SyscallConn()
}

// tlsConn is what fasthttp looks for to tell a TLS connection.
type tlsConn interface {
	Handshake() error
	ConnectionState() tls.ConnectionState
}

type startTLSConn struct {
	*startConn
	tls tlsConn
}

func (c *startTLSConn) Handshake() error                     { return c.tls.Handshake() }
func (c *startTLSConn) ConnectionState() tls.ConnectionState { return c.tls.ConnectionState() }

// requestLinePath is the path of the request line at the start of b (origin or absolute form,
// without its query); "" when b holds no whole request line.
func requestLinePath(b []byte) string {
	_, rest, ok := bytes.Cut(b, []byte(" "))
	if !ok {
		return ""
	}
	target, _, ok := bytes.Cut(rest, []byte(" "))
	if !ok {
		return ""
	}
	if i := bytes.Index(target, []byte("://")); i >= 0 { // absolute form: drop scheme and host
		target = target[i+3:]
		j := bytes.IndexByte(target, '/')
		if j < 0 {
			return ""
		}
		target = target[j:]
	}
	target, _, _ = bytes.Cut(target, []byte("?"))
	return string(target)
}

// requestPathOf is the path a connection recorded for its current request; "" when it keeps none.
func requestPathOf(c net.Conn) string {
	switch sc := c.(type) {
	case *startConn:
		return sc.requestPath()
	case *startTLSConn:
		return sc.requestPath()
	}
	return ""
}
