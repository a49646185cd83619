package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/metrics"
	"github.com/cacheroute/cacheroute/internal/upstream"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// UpstreamOptions shape the connections to workers.
type UpstreamOptions struct {
	// Dialer connects to workers (TLS, --worker-url-allow, credentials) and carries the timeouts
	// of every call to them; the routed path reads Dial, Idle and FirstByte (an attempt waiting
	// for its answer's first byte also looks every stallPoll whether its worker was found
	// stalled, and gives up if so).
	upstream.Dialer
	MaxIdlePerWorker int // idle keep-alive connections kept per worker URL
}

// upstreams keeps one pool of keep-alive connections per worker URL. The proxy holds the
// connection of each attempt itself (fasthttp writes the request and parses the answer on it), so
// it always knows what an attempt did on the wire — whether the connection was pooled, whether
// the request was written, whether any byte of an answer came — and can close the connection the
// moment the client goes away.
type upstreams struct {
	opts  UpstreamOptions
	mu    sync.Mutex
	pools atomic.Pointer[map[string]*connPool]
}

func newUpstreams(opts UpstreamOptions) *upstreams {
	u := &upstreams{opts: opts}
	u.pools.Store(&map[string]*connPool{})
	return u
}

// pool returns the pool of baseURL, creating it on first use. Lookups take no lock.
func (u *upstreams) pool(baseURL string) (*connPool, error) {
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
	p := &connPool{opts: u.opts, target: target}
	next := make(map[string]*connPool, len(old)+1)
	for k, v := range old {
		next[k] = v
	}
	next[baseURL] = p
	u.pools.Store(&next)
	return p, nil
}

// forget closes the idle connections of a removed worker and drops its pool; connections in use
// close when their exchange ends.
func (u *upstreams) forget(baseURL string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	old := *u.pools.Load()
	p := old[baseURL]
	if p == nil {
		return
	}
	next := make(map[string]*connPool, len(old))
	for k, v := range old {
		if k != baseURL {
			next[k] = v
		}
	}
	u.pools.Store(&next)
	p.close()
}

// closeIdle closes every pool's idle connections (shutdown).
func (u *upstreams) closeIdle() {
	for _, p := range *u.pools.Load() {
		p.closeIdle()
	}
}

// connPool is the keep-alive connections to one worker: a stack, so the most recently used
// connection (the one least likely to have been closed by the worker) is reused first.
type connPool struct {
	opts   UpstreamOptions
	target upstream.Target // where and how to connect, and the worker's credential
	mu     sync.Mutex
	idle   []*upConn
	closed bool
}

// get returns a pooled connection that is still open, or a new one. Every pooled connection is
// checked for a close by the worker before it is reused (one non-blocking poll): a worker closes
// idle connections on its own schedule, and one it closed shows as readable at end of file.
// Skipping those here saves the attempt a failed write. A close that crosses the request on the
// wire cannot be seen here; send re-sends that request on a connection from dial.
func (p *connPool) get() (*upConn, error) {
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
		if now.Sub(c.idleSince) > p.opts.Timeouts.Idle || peerClosed(c.raw) {
			_ = c.conn.Close()
			continue
		}
		c.reused = true
		return c, nil
	}
	return p.dial()
}

// dial opens a new connection to the worker, past the pool.
func (p *connPool) dial() (*upConn, error) {
	conn, err := p.opts.Dial(context.Background(), p.target)
	if err != nil {
		return nil, &dialError{err}
	}
	c := &upConn{raw: conn, conn: conn, pool: p}
	if tc, ok := conn.(*tls.Conn); ok {
		c.raw = tc.NetConn()
	}
	c.br = bufio.NewReaderSize(countingReader{c}, 16<<10)
	c.bw = bufio.NewWriterSize(c.conn, 16<<10)
	return c, nil
}

// put returns a connection whose answer was read to its end.
func (p *connPool) put(c *upConn) {
	c.idleSince = time.Now()
	c.read, c.wrote, c.writeFailed, c.worker = 0, false, false, nil
	p.mu.Lock()
	if p.closed || len(p.idle) >= p.opts.MaxIdlePerWorker {
		p.mu.Unlock()
		_ = c.conn.Close()
		return
	}
	p.idle = append(p.idle, c)
	p.mu.Unlock()
}

func (p *connPool) closeIdle() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	p.mu.Unlock()
	for _, c := range idle {
		_ = c.conn.Close()
	}
}

func (p *connPool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.closeIdle()
}

// upConn is one connection to a worker and the record of the attempt it carries now.
type upConn struct {
	raw  net.Conn // the TCP connection
	conn net.Conn // raw, or TLS over it
	br   *bufio.Reader
	bw   *bufio.Writer
	pool *connPool
	// worker is the tenant of the attempt the connection carries now: each byte read from it is
	// that worker's progress (stalled workers are found by its absence).
	worker *workers.Worker

	idleSince   time.Time
	reused      bool  // the connection answered a request before this one
	wrote       bool  // the whole request was written and flushed
	writeFailed bool  // writing the request failed
	read        int64 // bytes of this attempt's answer read from the socket
}

// countingReader counts the bytes an attempt reads, so a failure can tell "nothing came back"
// from "the answer broke off".
type countingReader struct{ c *upConn }

func (r countingReader) Read(p []byte) (int, error) {
	n, err := r.c.conn.Read(p)
	r.c.read += int64(n)
	if n > 0 && r.c.worker != nil {
		r.c.worker.Progressed()
	}
	return n, err
}

// dialError marks a failure to connect: nothing reached the worker.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// failure is how one attempt failed, decided from the error and the connection's record.
type failure struct {
	kind      string // upstream_errors_total{kind}
	retryable bool   // provably nothing was generated: another worker may take it
	stale     bool   // a pooled connection the worker had closed: the same worker may take it again at once
	message   string // for the client; never a socket address
}

// classify applies the retry rule: retry only what provably did not start generating.
func classify(err error, c *upConn, requestTimedOut bool) failure {
	var de *dialError
	switch {
	case errors.Is(err, errStalled):
		// Nothing of the answer came, so nothing reached the client: another worker may take it.
		return failure{kind: metrics.ErrStalled, retryable: true, message: "the worker stalled: no progress on its requests and no answer to a probe request"}
	case errors.As(err, &de):
		if isTimeout(de.err) {
			return failure{kind: metrics.ErrConnect, retryable: true, message: "connecting to the worker timed out"}
		}
		return failure{kind: metrics.ErrConnect, retryable: true, message: "the worker refused the connection or could not be reached"}
	case requestTimedOut:
		return failure{kind: metrics.ErrTimeout, message: "the worker did not answer within the request timeout"}
	case c == nil:
		return failure{kind: metrics.ErrConnect, retryable: true, message: "the worker could not be reached"}
	case !c.wrote:
		// The request never fully reached the worker, which cannot act on a partial JSON body.
		return failure{kind: metrics.ErrReset, retryable: true, stale: c.reused, message: "the connection to the worker closed before the request was sent"}
	case c.read > 0 && isTimeout(err):
		// classify sees only failures before the answer's headers were whole: a worker that
		// began them but did not finish within the first-byte timeout sent the client nothing.
		return failure{kind: metrics.ErrFirstByte, retryable: true, message: "the worker did not send its response headers within the first-byte timeout"}
	case c.read > 0:
		return failure{kind: metrics.ErrBadReply, message: "the worker's answer could not be read"}
	case isTimeout(err):
		return failure{kind: metrics.ErrFirstByte, retryable: true, message: "the worker did not start answering within the first-byte timeout"}
	case c.reused:
		// A pooled connection closed before a single byte of the answer: the worker had closed it
		// while idle, and never read this request.
		return failure{kind: metrics.ErrReset, retryable: true, stale: true, message: "the worker closed an idle connection"}
	default:
		return failure{kind: metrics.ErrSent, message: "the worker closed the connection after receiving the request"}
	}
}

func isTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
