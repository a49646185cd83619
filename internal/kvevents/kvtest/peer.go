package kvtest

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// peer.go speaks ZMTP 3.0 by hand over plain TCP on loopback, as a publisher that a router must not
// trust would: it performs the NULL handshake as a PUB socket, after which a test writes whatever
// bytes it likes (a frame header announcing 2^62 bytes, a message of endless frames).

// Greeting is a ZMTP 3.0 greeting for the NULL mechanism, as a client.
func Greeting() []byte {
	g := make([]byte, 64)
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0 // signature, version 3.0
	copy(g[12:], "NULL")
	return g
}

// Ready is the NULL mechanism's READY command of a socket of type socketType ("PUB").
func Ready(socketType string) []byte {
	body := []byte{5}
	body = append(body, "READY"...)
	body = append(body, byte(len("Socket-Type")))
	body = append(body, "Socket-Type"...)
	body = binary.BigEndian.AppendUint32(body, uint32(len(socketType)))
	body = append(body, socketType...)
	return append(FrameHeader(0x04, uint64(len(body))), body...)
}

// FrameHeader is the header of a frame of size bytes: flags (0x01 more, 0x04 command) and the
// size in one byte, or in eight with the long flag (0x02), which a size over 255 gets.
func FrameHeader(flags byte, size uint64) []byte {
	if size > 255 {
		return binary.BigEndian.AppendUint64([]byte{flags | 0x02}, size)
	}
	return []byte{flags, byte(size)}
}

// handshake performs the NULL handshake as a PUB on c: greeting and READY out, the other side's
// greeting and READY in.
func handshake(t testing.TB, c net.Conn) {
	t.Helper()
	if _, err := c.Write(append(Greeting(), Ready("PUB")...)); err != nil {
		t.Fatal(err)
	}
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	var greeting [64]byte
	var header [2]byte
	if _, err := io.ReadFull(c, greeting[:]); err != nil {
		t.Fatalf("the other side's greeting: %v", err)
	}
	if _, err := io.ReadFull(c, header[:]); err != nil || header[0] != 0x04 {
		t.Fatalf("the other side's READY: %v (flags %#x)", err, header[0])
	}
	if _, err := io.ReadFull(c, make([]byte, header[1])); err != nil {
		t.Fatalf("the other side's READY: %v", err)
	}
	if err := c.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
}

// DialAsPublisher connects to a SUB socket bound at endpoint (tcp://127.0.0.1:port) and performs
// the handshake as a PUB; the connection is closed when the test ends.
func DialAsPublisher(t testing.TB, endpoint string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", strings.TrimPrefix(endpoint, "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	handshake(t, c)
	return c
}

// ListenAsPublisher listens on a free loopback port, as an engine's PUB socket does, and performs
// the handshake with each subscriber that dials it, then sends hello and hands the connection to
// the returned channel (of room for 16; more are closed). It stops when the test ends.
func ListenAsPublisher(t testing.TB, hello []byte) (endpoint string, conns <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan net.Conn, 16)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if _, err := c.Write(append(append(Greeting(), Ready("PUB")...), hello...)); err != nil {
				c.Close()
				continue
			}
			select {
			case out <- c:
			default:
				c.Close()
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		close(out)
		for c := range out {
			c.Close()
		}
	})
	return "tcp://" + ln.Addr().String(), out
}

// Closed reports whether the other side of c has closed it, waiting at most 10 seconds for it,
// and reading (and dropping) whatever it sends meanwhile.
func Closed(c net.Conn) bool {
	if err := c.SetReadDeadline(time.Now().Add(10 * time.Second)); err != nil {
		return true
	}
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	return !errors.As(err, &ne) || !ne.Timeout()
}
