package upstream

import (
	"bufio"
	"context"
	"crypto/tls"
	"net"
	"sync"
	"sync/atomic"
	"time"
)

// pool.go keeps the connections of the routed path: requests the proxy forwards, and the lookups
// of stored responses. Unlike the net/http client of the router's own calls (Dialer.Client), each
// call holds its connection itself (fasthttp writes the request and parses the answer on it), so
// the caller always knows what a call did on the wire — whether the connection was pooled,
// whether the request was written, whether any byte of an answer came — and can cut the
// connection the moment its client goes away (Call.Cut).

// PoolOptions shape the routed path's connections to workers.
type PoolOptions struct {
	// Dialer connects to workers (TLS, --worker-url-allow, credentials) and carries the timeouts
	// of every call to them; the routed path reads Dial, Idle, FirstByte and Request.
	Dialer
	MaxIdlePerWorker int // idle keep-alive connections kept per worker URL
	// Resent, when set, is told the failure of each call that Send sends again on a new connection
	// because its pooled one had been closed by the worker (the proxy counts it as an upstream
	// error).
	Resent func(Failure)
}

// Pools keeps one Pool of keep-alive connections per worker URL.
type Pools struct {
	opts  PoolOptions
	mu    sync.Mutex
	pools atomic.Pointer[map[string]*Pool]
}

// NewPools returns the pools of the routed path, empty.
func NewPools(opts PoolOptions) *Pools {
	u := &Pools{opts: opts}
	u.pools.Store(&map[string]*Pool{})
	return u
}

// Options are the options the pools were made with.
func (u *Pools) Options() PoolOptions { return u.opts }

// Pool returns the pool of baseURL, creating it on first use. Lookups take no lock.
func (u *Pools) Pool(baseURL string) (*Pool, error) {
	if p := (*u.pools.Load())[baseURL]; p != nil {
		return p, nil
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	old := *u.pools.Load()
	if p := old[baseURL]; p != nil {
		return p, nil
	}
	target, err := u.opts.Target(baseURL)
	if err != nil {
		return nil, err
	}
	p := &Pool{opts: &u.opts, Target: target}
	next := make(map[string]*Pool, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[baseURL] = p
	u.pools.Store(&next)
	return p, nil
}

// Forget closes the idle connections of a removed worker and drops its pool; connections in use
// close when their call ends.
func (u *Pools) Forget(baseURL string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	old := *u.pools.Load()
	p := old[baseURL]
	if p == nil {
		return
	}
	next := make(map[string]*Pool, len(old))
	for k, v := range old {
		if k != baseURL {
			next[k] = v
		}
	}
	u.pools.Store(&next)
	p.close()
}

// CloseIdle closes every pool's idle connections (shutdown).
func (u *Pools) CloseIdle() {
	for _, p := range *u.pools.Load() {
		p.closeIdle()
	}
}

// Pool is the keep-alive connections to one worker: a stack, so the most recently used
// connection (the one least likely to have been closed by the worker) is reused first.
type Pool struct {
	opts *PoolOptions
	// Target is where and how to connect, and the worker's credential.
	Target Target
	mu     sync.Mutex
	idle   []*Conn
	closed bool
}

// get returns a pooled connection that is still open, or a new one. A pooled connection idle for
// closeCheckAfter or longer is checked for a close by the worker before it is reused (one
// non-blocking poll): a worker closes idle connections on its own schedule, and one it closed
// shows as readable at end of file. Skipping those here saves the call a failed write. A close
// that crosses the request on the wire cannot be seen here, nor one on a connection reused
// sooner; Send sends that request again on a connection from dial.
func (p *Pool) get() (*Conn, error) {
	now := time.Now()
	for {
		p.mu.Lock()
		n := len(p.idle)
		if n == 0 {
			p.mu.Unlock()
			break
		}
		c := p.idle[n-1]
		p.idle = p.idle[:n-1]
		p.mu.Unlock()
		idle := now.Sub(c.idleSince)
		if idle > p.opts.Timeouts.Idle || (idle >= closeCheckAfter && PeerClosed(c.raw)) {
			_ = c.conn.Close()
			continue
		}
		c.reused = true
		return c, nil
	}
	return p.dial()
}

// closeCheckAfter is how long a connection must have been idle before get checks that the worker
// has not closed it. A worker closes an idle connection at its keep-alive timeout, seconds after
// its last answer (uvicorn's default is 5 s); a connection reused within a second of its answer
// skips the system call the check costs, which under load was 2-3% of the router's CPU.
const closeCheckAfter = time.Second

// dial opens a new connection to the worker, past the pool.
func (p *Pool) dial() (*Conn, error) {
	conn, err := p.opts.Dial(context.Background(), p.Target)
	if err != nil {
		return nil, &dialError{err}
	}
	c := &Conn{raw: conn, conn: conn, pool: p}
	if tc, ok := conn.(*tls.Conn); ok {
		c.raw = tc.NetConn()
	}
	c.br = bufio.NewReaderSize(countingReader{c}, 16<<10)
	c.bw = bufio.NewWriterSize(c.conn, 16<<10)
	return c, nil
}

// put returns a connection whose answer was read to its end.
func (p *Pool) put(c *Conn) {
	c.idleSince = time.Now()
	c.read, c.wrote, c.writeFailed, c.peer = 0, false, false, nil
	p.mu.Lock()
	if p.closed || len(p.idle) >= p.opts.MaxIdlePerWorker {
		p.mu.Unlock()
		_ = c.conn.Close()
		return
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

func (p *Pool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		_ = c.conn.Close()
	}
}

func (p *Pool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.closeIdle()
}

// Conn is one connection to a worker and the record of the call it carries now.
type Conn struct {
	raw  net.Conn // the TCP connection
	conn net.Conn // raw, or TLS over it
	br   *bufio.Reader
	bw   *bufio.Writer
	pool *Pool
	// peer is the worker of the call the connection carries now: each byte read from it is that
	// worker's progress (stalled workers are found by its absence).
	peer Peer

	idleSince   time.Time
	reused      bool  // the connection answered a request before this one
	wrote       bool  // the whole request was written and flushed
	writeFailed bool  // writing the request failed
	read        int64 // bytes of this call's answer read from the socket
}

// Close closes the connection, whatever it is doing: a read or write in progress on another
// goroutine fails at once.
func (c *Conn) Close() { _ = c.conn.Close() }

// countingReader counts the bytes a call reads, so a failure can tell "nothing came back" from
// "the answer broke off".
type countingReader struct{ c *Conn }

func (r countingReader) Read(p []byte) (int, error) {
	n, err := r.c.conn.Read(p)
	r.c.read += int64(n)
	if n > 0 && r.c.peer != nil {
		r.c.peer.Progressed()
	}
	return n, err
}
