package testkit

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
)

// RawServer is a server on a loopback TCP listener that speaks HTTP/1.1 by hand, for behaviour a
// net/http server never shows: closing a kept-alive connection right after answering, closing
// after reading a request, never answering, lying about Content-Length. Each accepted connection
// goes to serve, and is closed when serve returns; every connection is closed when the test ends.
type RawServer struct {
	URL      string
	Conns    atomic.Int64 // connections accepted
	Requests atomic.Int64 // requests read whole by ReadRequest or Read

	mu   sync.Mutex
	open []net.Conn
	wg   sync.WaitGroup
}

// NewRawServer serves each connection with serve until the test ends.
func NewRawServer(t testing.TB, serve func(s *RawServer, c net.Conn, br *bufio.Reader)) *RawServer {
	t.Helper()
	ln := Listen(t)
	s := &RawServer{URL: "http://" + ln.Addr().String()}
	s.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.Conns.Add(1)
			s.mu.Lock()
			s.open = append(s.open, c)
			s.mu.Unlock()
			s.wg.Go(func() {
				defer c.Close()
				serve(s, c, bufio.NewReader(c))
			})
		}
	})
	t.Cleanup(func() {
		_ = ln.Close()
		s.mu.Lock()
		for _, c := range s.open {
			_ = c.Close()
		}
		s.mu.Unlock()
		s.wg.Wait()
	})
	return s
}

// ReadRequest reads one whole request (headers and body) from br and counts it.
func (s *RawServer) ReadRequest(br *bufio.Reader) (*http.Request, []byte, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(req.Body)
	if err != nil {
		return nil, nil, err
	}
	s.Requests.Add(1)
	return req, body, nil
}

// Read is ReadRequest for a server that needs only to know whether a whole request came.
func (s *RawServer) Read(br *bufio.Reader) bool {
	_, _, err := s.ReadRequest(br)
	return err == nil
}
