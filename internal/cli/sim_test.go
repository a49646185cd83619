package cli

import (
	"context"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/cacheroute/cacheroute/internal/kvevents"
)

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

func TestSimRefusesAnUnknownKVEventsEncoding(t *testing.T) {
	_, _, err := run(context.Background(), "sim", "--port", "0", "--kv-events-endpoint", "tcp://127.0.0.1:5557", "--kv-events-encoding", "json")
	if err == nil || !strings.Contains(err.Error(), "encoding") {
		t.Fatalf("err = %v, want the encoding refused", err)
	}
}

// TestSimPublishesKVEventsToTheSubscriberItDials runs `cacheroute sim` with a loopback endpoint
// (no wildcard: the sim dials, the subscriber binds) and reads the clear that a reset publishes.
func TestSimPublishesKVEventsToTheSubscriberItDials(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	endpoint := "tcp://127.0.0.1:" + strconv.Itoa(freePort(t))
	sub := zmq4.NewSub(ctx)
	defer sub.Close()
	if err := sub.Listen(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, "kv@"); err != nil {
		t.Fatal(err)
	}
	msgs := make(chan zmq4.Msg, 16)
	go func() {
		for {
			m, err := sub.Recv()
			if err != nil {
				return
			}
			select {
			case msgs <- m:
			default: // the test has what it needs
			}
		}
	}()
	port := strconv.Itoa(freePort(t))
	done := make(chan error, 1)
	go func() {
		_, _, err := run(ctx, "sim", "--port", port, "--time-scale", "0", "--kv-events-endpoint", endpoint,
			"--kv-events-topic", "kv@sim", "--kv-events-encoding", "map")
		done <- err
	}()
	var got zmq4.Msg
	deadline := time.After(10 * time.Second)
	for got.Frames == nil {
		if resp, err := http.Post("http://127.0.0.1:"+port+"/reset_prefix_cache", "application/json", nil); err == nil {
			resp.Body.Close()
		}
		select {
		case got = <-msgs:
		case err := <-done:
			t.Fatalf("sim ended: %v", err)
		case <-deadline:
			t.Fatal("timed out waiting for an event batch")
		case <-time.After(50 * time.Millisecond):
		}
	}
	if len(got.Frames) != 3 || string(got.Frames[0]) != "kv@sim" || len(got.Frames[1]) != 8 {
		t.Fatalf("frames %q", got.Frames)
	}
	b, err := kvevents.NewDecoder().Decode(got.Frames[2])
	if err != nil || len(b.Events) == 0 || b.Events[len(b.Events)-1].Kind != kvevents.Cleared {
		t.Fatalf("batch %+v, %v: want a clear", b, err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("sim: %v", err)
	}
}
