package kvevents

import (
	"context"
	"errors"
	"net"
	"strings"

	"github.com/go-zeromq/zmq4"
	"github.com/go-zeromq/zmq4/transport"
)

// boundedTCP is the transport a replay is dialled over: TCP whose connection carries the dial
// context's deadline. zmq4 performs the ZMTP handshake without one, so a replay endpoint that
// accepts the connection and never speaks (a port something else holds, a stalled engine) would
// hold the subscriber past its 2 s bound, and past its own shutdown.
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
	return c, nil
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
