package router

import (
	"net"
	"sync/atomic"
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
