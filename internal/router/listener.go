package router

import (
	"errors"
	"log/slog"
	"net"
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
