package proxy

import (
	"crypto/tls"
	"net"
	"syscall"
)

// peerClosed reports whether the other end of c closed it, by peeking at the socket without
// taking any byte from it (data that did arrive, such as a pipelined request, stays where it is).
// It never blocks; false when unsure.
func peerClosed(c net.Conn) bool {
	if tc, ok := c.(*tls.Conn); ok {
		c = tc.NetConn() // end of file shows on the TCP socket under TLS as well
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	closed := false
	var buf [1]byte
	_ = raw.Read(func(fd uintptr) bool {
		n, _, err := syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		// n == 0 without an error is an orderly close; EAGAIN means open and quiet.
		closed = (n == 0 && err == nil) || err == syscall.ECONNRESET
		return true
	})
	return closed
}
