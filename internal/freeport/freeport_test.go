package freeport

import (
	"net"
	"strconv"
	"testing"
)

func TestPortIsFreeToListenOnLoopback(t *testing.T) {
	port, err := Port()
	if err != nil {
		t.Fatal(err)
	}
	if port <= 0 || port > 65535 {
		t.Fatalf("port %d is out of range", port)
	}
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		t.Fatalf("port %d was given as free but cannot be listened on: %v", port, err)
	}
	ln.Close()
}
