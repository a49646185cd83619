package router

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// flakyListener fails its first failures accepts with err, then accepts from the real listener.
type flakyListener struct {
	net.Listener
	failures atomic.Int32
	err      error
}

func (l *flakyListener) Accept() (net.Conn, error) {
	if l.failures.Add(-1) >= 0 {
		return nil, l.err
	}
	return l.Listener.Accept()
}

func TestAcceptSurvivesRunningOutOfFileDescriptors(t *testing.T) {
	ln := testkit.Listen(t)
	defer ln.Close()
	flaky := &flakyListener{Listener: ln, err: &net.OpError{Op: "accept", Err: syscall.EMFILE}}
	flaky.failures.Store(3)
	l := retryAccept(flaky, slog.New(slog.DiscardHandler))
	go func() {
		if c, err := net.Dial("tcp", ln.Addr().String()); err == nil {
			defer c.Close()
			time.Sleep(2 * time.Second)
		}
	}()
	done := make(chan error, 1)
	go func() {
		c, err := l.Accept()
		if c != nil {
			c.Close()
		}
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Accept gave up: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Accept did not recover")
	}
}

func TestAcceptStillFailsOnOtherErrors(t *testing.T) {
	ln := testkit.Listen(t)
	ln.Close()
	if _, err := retryAccept(ln, slog.New(slog.DiscardHandler)).Accept(); err == nil {
		t.Fatal("a closed listener accepted")
	}
}

func TestConnectionsOverTheCapGet503AndTheRestStillWork(t *testing.T) {
	ln := testkit.Listen(t)
	capped := capListener(ln, 2)
	defer capped.Close()
	accepted := make(chan struct{}, 3)
	go func() {
		for {
			c, err := capped.Accept()
			if err != nil {
				return
			}
			accepted <- struct{}{}
			go func() { // an echo of one line, then close
				line, _ := bufio.NewReader(c).ReadString('\n')
				_, _ = io.WriteString(c, line)
				c.Close()
			}()
		}
	}()
	var held []net.Conn
	for range 2 {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	for range 2 { // both are counted before the next dial
		select {
		case <-accepted:
		case <-time.After(5 * time.Second):
			t.Fatal("the connections within the cap were not accepted")
		}
	}
	over, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	_ = over.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, _ := io.ReadAll(over)
	if !strings.HasPrefix(string(got), "HTTP/1.1 503") {
		t.Fatalf("connection over the cap got %q, want a 503", got)
	}
	for i, c := range held {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "ping\n")
		if line, err := bufio.NewReader(c).ReadString('\n'); err != nil || line != "ping\n" {
			t.Fatalf("connection %d within the cap: %q, %v", i, line, err)
		}
		c.Close()
	}
	// Closed connections free their places.
	testkit.WaitFor(t, "a place to free up", func() bool {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			return false
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(time.Second))
		_, _ = io.WriteString(c, "again\n")
		line, _ := bufio.NewReader(c).ReadString('\n')
		return line == "again\n"
	})
}

func TestOneClientAddressOverItsConnectionCapGets429WhileAnotherAddressIsServed(t *testing.T) {
	cfg := testConfig()
	cfg.MaxConnectionsPerClient = 2
	tr := startRouter(t, cfg, newFakeWorker(t))
	addr := strings.TrimPrefix(tr.url, "http://")
	dialFrom := func(ip string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}, Timeout: 2 * time.Second}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	ask := func(c net.Conn) (*http.Response, string) {
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.WriteString(c, "GET /liveness HTTP/1.1\r\nHost: router\r\n\r\n")
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp, string(b)
	}
	held := []net.Conn{dialFrom("127.0.0.1"), dialFrom("127.0.0.1")}
	for _, c := range held { // both accepted and served
		if resp, _ := ask(c); resp.StatusCode != http.StatusOK {
			t.Fatalf("within the cap: %d", resp.StatusCode)
		}
	}
	resp, body := ask(dialFrom("127.0.0.1"))
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(body, `"code":"too_many_connections"`) {
		t.Fatalf("over the cap: %d, Retry-After %q, %s", resp.StatusCode, resp.Header.Get("Retry-After"), body)
	}
	if resp, _ := ask(dialFrom("127.0.0.2")); resp.StatusCode != http.StatusOK {
		t.Fatalf("another address: %d", resp.StatusCode)
	}
	// A closed connection gives its place back.
	held[0].Close()
	testkit.WaitFor(t, "a place for the address again", func() bool {
		c := dialFrom("127.0.0.1")
		defer c.Close()
		resp, _ := ask(c)
		return resp.StatusCode == http.StatusOK
	})
}
