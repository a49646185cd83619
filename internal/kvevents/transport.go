package kvevents

import (
	"context"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// boundedTCP is the transport every event connection goes over, dialled (streams, replays) or
// accepted (the bound endpoint): TCP whose bytes are followed through ZMTP's framing (zmtp.go), so
// that a peer announcing a frame or a message over its bound has its connection closed before
// zmq4 allocates for it, and one that has not ended its handshake within handshakeTimeout is
// closed too. A dialled connection also carries its dial context's deadline and is closed when
// that context ends: zmq4 performs the handshake without either, so an endpoint that accepts and
// never speaks would hold a replay past its 2 s bound, and a stream or a replay past the
// subscriber's own shutdown.
const boundedTCP = "cacheroute-bounded-tcp"

// handshakeTimeout bounds the ZMTP handshake of every event connection. zmq4 accepts one
// connection at a time and performs its handshake before accepting the next, so a peer that
// connected to the bound endpoint and never spoke held out every publisher after it.
const handshakeTimeout = 5 * time.Second

func init() {
	if err := zmq4.RegisterTransport(boundedTCP, boundedTransport{transport.New("tcp")}); err != nil {
		panic(err)
	}
}

// PeerDrops count the event connections closed for breaking a bound; they only grow.
type PeerDrops struct {
	Oversized atomic.Int64 // a frame or a message over its bound (MaxMessageBytes), or a command over its own
	Handshake atomic.Int64 // no ZMTP handshake within handshakeTimeout
	OverLimit atomic.Int64 // accepted on the bound endpoint while it held its most connections
}

// DroppedConnections are PeerDrops at one moment.
type DroppedConnections struct{ Oversized, Handshake, OverLimit int64 }

func (d *PeerDrops) load() DroppedConnections {
	return DroppedConnections{Oversized: d.Oversized.Load(), Handshake: d.Handshake.Load(), OverLimit: d.OverLimit.Load()}
}

func (d DroppedConnections) plus(o DroppedConnections) DroppedConnections {
	return DroppedConnections{Oversized: d.Oversized + o.Oversized, Handshake: d.Handshake + o.Handshake, OverLimit: d.OverLimit + o.OverLimit}
}

// guard is what a socket's connections report to, carried by the context the socket is made with
// (zmq4 passes it on to the transport): where drops are counted and, for a bound endpoint, the
// most connections it holds open at once.
type guard struct {
	drops *PeerDrops
	limit func() int // nil: no limit
}

type guardKey struct{}

// guarded is ctx carrying g for the sockets made with it.
func guarded(ctx context.Context, g *guard) context.Context {
	return context.WithValue(ctx, guardKey{}, g)
}

func guardOf(ctx context.Context) *guard {
	if g, ok := ctx.Value(guardKey{}).(*guard); ok {
		return g
	}
	return &guard{drops: new(PeerDrops)}
}

type boundedTransport struct{ transport.Transport }

func (t boundedTransport) Dial(ctx context.Context, d transport.Dialer, addr string) (net.Conn, error) {
	c, err := t.Transport.Dial(ctx, d, addr)
	if err != nil {
		return nil, err
	}
	if deadline, ok := ctx.Deadline(); ok {
		if err := c.SetDeadline(deadline); err != nil {
			c.Close()
			return nil, err
		}
	}
	pc := newPeerConn(c, guardOf(ctx), nil)
	pc.closeWith(ctx)
	return pc, nil
}

func (t boundedTransport) Listen(ctx context.Context, addr string) (net.Listener, error) {
	ln, err := t.Transport.Listen(ctx, addr)
	if err != nil {
		return nil, err
	}
	return &peerListener{Listener: ln, guard: guardOf(ctx)}, nil
}

// peerListener hands zmq4 each accepted connection as a peerConn, and closes at once those
// accepted while its guard's limit of open connections is reached.
type peerListener struct {
	net.Listener
	guard *guard
	open  atomic.Int64
}

func (l *peerListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if l.guard.limit != nil && l.open.Load() >= int64(l.guard.limit()) {
			l.guard.drops.OverLimit.Add(1)
			c.Close()
			continue
		}
		l.open.Add(1)
		return newPeerConn(c, l.guard, func() { l.open.Add(-1) }), nil
	}
}

// peerConn is one event connection followed through ZMTP's framing. A read that would hand zmq4
// a header breaking a bound fails instead, and closes the connection; a connection whose handshake
// has not ended within handshakeTimeout is closed.
type peerConn struct {
	net.Conn
	guard  *guard
	closed func()  // called once on Close; nil for nothing
	frames framing // fed by Read, which zmq4 calls from one goroutine at a time
	err    error
	ready  bool
	once   sync.Once

	mu        sync.Mutex
	handshake *time.Timer
	stop      func() bool // ends the watch of a dialled connection's context; nil when accepted
}

func newPeerConn(c net.Conn, g *guard, closed func()) *peerConn {
	pc := &peerConn{Conn: c, guard: g, closed: closed}
	pc.mu.Lock()
	pc.handshake = time.AfterFunc(handshakeTimeout, func() {
		g.drops.Handshake.Add(1)
		pc.Close()
	})
	pc.mu.Unlock()
	return pc
}

// closeWith closes c when ctx ends; closing c first lets ctx go.
func (c *peerConn) closeWith(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.stop = context.AfterFunc(ctx, func() { c.Close() })
}

func (c *peerConn) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(p)
	if ferr := c.frames.feed(p[:n]); ferr != nil {
		c.err = &boundError{ferr.Error()}
		c.guard.drops.Oversized.Add(1)
		c.Close()
		return 0, c.err
	}
	if !c.ready && c.frames.handshaken() {
		c.ready = true
		c.mu.Lock()
		c.handshake.Stop()
		c.mu.Unlock()
	}
	return n, err
}

func (c *peerConn) Close() error {
	c.once.Do(func() {
		c.mu.Lock()
		c.handshake.Stop()
		if c.stop != nil {
			c.stop()
		}
		c.mu.Unlock()
		if c.closed != nil {
			c.closed()
		}
	})
	return c.Conn.Close()
}

// boundError is why a connection was failed. It is a net.Error and no timeout, so that zmq4 takes
// the connection for closed and lets it go.
type boundError struct{ reason string }

func (e *boundError) Error() string   { return "kv events: peer closed for " + e.reason }
func (e *boundError) Timeout() bool   { return false }
func (e *boundError) Temporary() bool { return false }

// bounded is endpoint over boundedTCP when it is tcp://, else as it is.
func bounded(endpoint string) string {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		return boundedTCP + "://" + rest
	}
	return endpoint
}
