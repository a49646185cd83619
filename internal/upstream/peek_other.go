//go:build !linux

package upstream

import "syscall"

// closedSocket peeks at the socket's next byte: none, without an error, is an orderly close.
// Unlike the Linux version it does not see a close behind unread data (a TLS close_notify).
func closedSocket(raw syscall.RawConn) bool {
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
