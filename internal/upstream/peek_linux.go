package upstream

import (
	"syscall"

	"golang.org/x/sys/unix"
)

// closedSocket asks the kernel whether the peer closed the socket or reset it: POLLRDHUP is set
// once the peer's FIN has arrived, however much unread data is queued before it. That matters
// under TLS, where a client that leaves politely sends a close_notify record first: the record
// sits unread in front of the end of the stream, so peeking at the next byte would not see the
// close.
func closedSocket(raw syscall.RawConn) bool {
	closed := false
	_ = raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		n, err := unix.Poll(fds, 0)
		closed = err == nil && n > 0 && fds[0].Revents&(unix.POLLRDHUP|unix.POLLHUP|unix.POLLERR) != 0
	})
	return closed
}
