package kvevents

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// bind runs a Bound at a free loopback endpoint, reading worker w1 by the topic "kv@test", until
// the test ends.
func bind(t *testing.T) (*Bound, *Index) {
	t.Helper()
	x := NewIndex(1 << 20)
	b := NewBound(kvtest.FreeEndpoint(t), x, nil)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := b.Listen(ctx); err != nil {
		t.Fatal(err)
	}
	b.Sync([]BoundWorker{{Source: Source{Worker: "w1", Model: "m"}, Topics: []string{"kv@test"}}})
	return b, x
}

// publishTo dials a real ZMQ PUB socket to endpoint and sends payload, under topic kv@test and
// sequence numbers from 0, until done says the message arrived.
func publishTo(t *testing.T, endpoint string, payload []byte, done func() bool) {
	t.Helper()
	pub := zmq4.NewPub(context.Background())
	defer pub.Close()
	if err := pub.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	var seq int64
	arrived := testkit.Poll(30*time.Second, 20*time.Millisecond, func() bool {
		if done() {
			return true
		}
		if err := pub.Send(zmq4.NewMsgFrom([]byte("kv@test"), kvtest.BigEndian(seq), payload)); err != nil {
			t.Fatal(err)
		}
		seq++
		return false
	})
	if !arrived {
		t.Fatal("timed out waiting for a publisher's message to arrive")
	}
}

// A publisher that completes the handshake and then announces a frame or a message over the
// bound has its connection closed before anything is allocated for it, and counted; the endpoint
// goes on reading the other publishers. A header announcing 2^62 bytes crashed the process
// (zmq4 allocates what a header announces), one announcing 2 GiB held it while bytes streamed in.
func TestBoundEndpointClosesAPeerOverTheBoundAndReadsTheOthers(t *testing.T) {
	half := MaxMessageBytes / 2
	cases := map[string][]byte{
		"a frame of 2^62 bytes":              kvtest.FrameHeader(0, 1<<62),
		"a frame of 2 GiB, streamed":         append(kvtest.FrameHeader(0, 2<<30), make([]byte, 1<<20)...),
		"a frame one byte over the bound":    kvtest.FrameHeader(0, MaxMessageBytes+1),
		"two frames one byte over the bound": append(append(kvtest.FrameHeader(0x01, uint64(half)), make([]byte, half)...), kvtest.FrameHeader(0, uint64(half+1))...),
		"a message of endless frames":        bytes.Repeat(kvtest.FrameHeader(0x01, 1), 1000),
		"a command of 1 MiB":                 kvtest.FrameHeader(0x04, 1<<20),
	}
	for name, hostile := range cases {
		t.Run(name, func(t *testing.T) {
			b, x := bind(t)
			c := kvtest.DialAsPublisher(t, b.Endpoint())
			_, _ = c.Write(hostile) // fails once the router has closed the connection, as it should
			if !kvtest.Closed(c) {
				t.Fatal("the connection is still open")
			}
			testkit.WaitFor(t, "the connection counted", func() bool { return b.Drops.Oversized.Load() == 1 })
			publishTo(t, b.Endpoint(), stores(t, nil, 0, 1), func() bool { return x.Blocks("w1") == 1 })
		})
	}
}

// A message of exactly MaxMessageBytes, the three frames together, is read and applied.
func TestBoundEndpointReadsAMessageOfExactlyTheBound(t *testing.T) {
	b, _ := bind(t)
	pad := MaxMessageBytes
	var payload []byte
	for range 3 { // the padding's own length field shrinks as the padding does: converge
		payload = mustMarshal(t, map[string]any{"ts": 1.0, "events": []any{}, "pad": make([]byte, pad)})
		pad -= len("kv@test") + 8 + len(payload) - MaxMessageBytes
	}
	if len("kv@test")+8+len(payload) != MaxMessageBytes {
		t.Fatalf("the message is %d bytes", len("kv@test")+8+len(payload))
	}
	st := func() Status { return b.Status()[0] }
	publishTo(t, b.Endpoint(), payload, func() bool { return st().Batches >= 1 })
	if d := b.Drops.load(); d != (DroppedConnections{}) || st().DecodeErrors != 0 {
		t.Fatalf("dropped %+v, decode errors %d", d, st().DecodeErrors)
	}
}

// A subscriber whose publisher announces a frame of 2^62 bytes closes the connection, counts it,
// and dials again.
func TestSubscriberClosesAPublisherAnnouncingAHugeFrame(t *testing.T) {
	endpoint, conns := kvtest.ListenAsPublisher(t, kvtest.FrameHeader(0, 1<<62))
	s, _ := run(t, Source{Worker: "w1", Model: "m", Endpoint: endpoint})
	c := <-conns
	if !kvtest.Closed(c) {
		t.Fatal("the connection is still open")
	}
	testkit.WaitFor(t, "the connection counted and dialled again", func() bool { return s.drops.Oversized.Load() >= 1 && len(conns) > 0 })
}

// A peer that connects to the bound endpoint and never speaks is closed once the handshake time
// is up; zmq4 performs one handshake at a time, and every publisher after it waited for ever.
func TestBoundEndpointClosesAPeerThatNeverHandshakes(t *testing.T) {
	b, x := bind(t)
	silent, err := net.Dial("tcp", strings.TrimPrefix(b.Endpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	publishTo(t, b.Endpoint(), stores(t, nil, 0, 1), func() bool { return x.Blocks("w1") == 1 })
	if !kvtest.Closed(silent) || b.Drops.Handshake.Load() != 1 {
		t.Fatalf("the silent connection open, or not counted (%d)", b.Drops.Handshake.Load())
	}
}

// The bound endpoint holds at most boundConnections open at once; one more is closed as it is
// accepted and counted, and a place freed is taken again.
func TestBoundEndpointHoldsABoundedNumberOfConnections(t *testing.T) {
	b, _ := bind(t) // one worker
	limit := int(boundConnections(1))
	held := make([]net.Conn, limit)
	for i := range held {
		held[i] = kvtest.DialAsPublisher(t, b.Endpoint())
	}
	over, err := net.Dial("tcp", strings.TrimPrefix(b.Endpoint(), "tcp://"))
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	if !kvtest.Closed(over) || b.Drops.OverLimit.Load() != 1 {
		t.Fatalf("the connection past the limit of %d is open, or not counted (%d)", limit, b.Drops.OverLimit.Load())
	}
	held[0].Close()
	testkit.WaitFor(t, "a freed place taken again", func() bool {
		c, err := net.Dial("tcp", strings.TrimPrefix(b.Endpoint(), "tcp://"))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write(append(kvtest.Greeting(), kvtest.Ready("PUB")...)); err != nil {
			return false
		}
		_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
		greeting := make([]byte, 64)
		_, err = c.Read(greeting)
		return err == nil
	})
}

// A publisher that goes away takes no other's stream with it: zmq4 reports the end of one
// connection as an error of the whole socket's Recv, and the bound endpoint stopped reading.
func TestBoundEndpointReadsOnAfterAPublisherLeaves(t *testing.T) {
	b, x := bind(t)
	publishTo(t, b.Endpoint(), stores(t, nil, 0, 1), func() bool { return x.Match("w1", keysOf(0, 1)).Blocks == 1 })
	publishTo(t, b.Endpoint(), stores(t, nil, 10, 1), func() bool { return x.Match("w1", keysOf(10, 1)).Blocks == 1 })
}
