package kvevents

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// boundedTCP is the transport streams and replays are dialled over: TCP whose connection carries
// the dial context's deadline and is closed when that context ends. zmq4 performs the ZMTP
// handshake without either, so an endpoint that accepts the connection and never speaks (a port
// something else holds, a stalled engine) would hold a replay past its 2 s bound, and a stream or
// a replay past the subscriber's own shutdown.
const boundedTCP = "cacheroute-bounded-tcp"

func init() {
	if err := zmq4.RegisterTransport(boundedTCP, boundedTransport{transport.New("tcp")}); err != nil {
		panic(err)
	}
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
	return &closedWithContext{Conn: c, stop: context.AfterFunc(ctx, func() { c.Close() })}, nil
}

// closedWithContext is a connection closed when its dial context ends; closing it first lets the
// context go.
type closedWithContext struct {
	net.Conn
	stop func() bool
}

func (c *closedWithContext) Close() error {
	c.stop()
	return c.Conn.Close()
}

func (boundedTransport) Listen(context.Context, string) (net.Listener, error) {
	return nil, errors.New("kv events: the bounded transport only dials")
}

// bounded is endpoint dialled over boundedTCP when it is tcp://, else as it is.
func bounded(endpoint string) string {
	if rest, ok := strings.CutPrefix(endpoint, "tcp://"); ok {
		return boundedTCP + "://" + rest
	}
	return endpoint
}
