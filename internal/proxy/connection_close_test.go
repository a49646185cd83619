package proxy

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"
)

// TestEveryRequestWithConnectionCloseHasItsConnectionClosed sends requests asking
// "Connection: close" from several clients at once, each on a connection of its own: every one is
// answered and then has its connection closed by the router. Nothing a request carries may change
// how a later request is read; in the poison build (which overwrites each request's buffers once
// it is answered) this fails when a buffer fasthttp shares between requests is overwritten, and
// under -race it shows the concurrent writes.
func TestEveryRequestWithConnectionCloseHasItsConnectionClosed(t *testing.T) {
	tp := newTestProxy(t, setup{urls: []string{okWorker(t, "a").URL}})
	const clients, each = 4, 10
	errs := make(chan error, clients*each)
	var wg sync.WaitGroup
	for range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range each {
				if err := closeAfterAnswer(tp.Addr); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

// closeAfterAnswer sends one chat request with "Connection: close" on a new connection and checks
// that it is answered 200 with "Connection: close" and that the router then closes the connection.
func closeAfterAnswer(addr string) error {
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.WriteString(c, rawRequest(http.MethodPost, chatPath, chatBody, "Connection: close")); err != nil {
		return err
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		return fmt.Errorf("read answer: %w", err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !resp.Close {
		return fmt.Errorf("answer %d, Connection %q; want 200 with Connection: close", resp.StatusCode, resp.Header.Get("Connection"))
	}
	// The router closes the connection after the answer: the next read ends, it does not time out.
	if _, err := br.ReadByte(); err == nil {
		return fmt.Errorf("a byte after the answer, want the connection closed")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		return fmt.Errorf("the connection was left open after a Connection: close request")
	}
	return nil
}
