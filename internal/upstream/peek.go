package upstream

import (
	"crypto/tls"
	"net"
	"syscall"
)

// PeerClosed reports whether the other end of c closed it (see closedSocket), without taking any
// byte from it: data that did arrive, such as a pipelined request, stays where it is. It never
// blocks; false when unsure. The pools ask it of an idle connection before reusing it, and the
// proxy of a client's connection while the client waits for its answer.
func PeerClosed(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn() // the close shows on the TCP socket under TLS as well
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	return closedSocket(raw)
}
