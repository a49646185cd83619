package kvevents

import (
	"context"
	"encoding/binary"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
)

// publisher is an engine's event publisher as vLLM runs one, on real ZMQ sockets on loopback: a
// PUB socket sending (topic, sequence, payload), and a ROUTER socket answering replay requests
// from its buffer of every batch sent, then the end marker -1.
type publisher struct {
	t        *testing.T
	pub      zmq4.Socket
	router   zmq4.Socket
	endpoint string
	replay   string

	mu     sync.Mutex
	buffer map[int64][]byte
	seq    int64
}

func freeEndpoint(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return "tcp://127.0.0.1:" + strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
}

func newPublisher(t *testing.T, withReplay bool) *publisher {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &publisher{t: t, pub: zmq4.NewPub(ctx), endpoint: freeEndpoint(t), buffer: map[int64][]byte{}}
	if err := p.pub.Listen(p.endpoint); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	if withReplay {
		p.router, p.replay = zmq4.NewRouter(ctx), freeEndpoint(t)
		if err := p.router.Listen(p.replay); err != nil {
			t.Fatal(err)
		}
		go p.serveReplay(done)
	} else {
		close(done)
	}
	t.Cleanup(func() {
		cancel()
		p.pub.Close()
		if p.router != nil {
			p.router.Close()
		}
		<-done
	})
	return p
}

// serveReplay answers replay requests until the router closes.
func (p *publisher) serveReplay(done chan struct{}) {
	defer close(done)
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		if len(msg.Frames) != 3 || len(msg.Frames[2]) != 8 {
			continue
		}
		id, start := msg.Frames[0], int64(binary.BigEndian.Uint64(msg.Frames[2]))
		p.mu.Lock()
		for seq := start; seq < p.seq; seq++ {
			if payload, ok := p.buffer[seq]; ok {
				_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, be(seq), payload))
			}
		}
		p.mu.Unlock()
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, be(-1), []byte{}))
	}
}

func be(seq int64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(seq))
	return b[:]
}

// send publishes payload under the next sequence number; drop keeps it from the stream (as a
// full high-water mark would) while the replay buffer still has it.
func (p *publisher) send(payload []byte, drop bool) {
	p.mu.Lock()
	seq := p.seq
	p.seq++
	p.buffer[seq] = payload
	p.mu.Unlock()
	if !drop {
		p.resend(seq)
	}
}

func (p *publisher) resend(seq int64) {
	p.mu.Lock()
	payload := p.buffer[seq]
	p.mu.Unlock()
	if err := p.pub.Send(zmq4.NewMsgFrom([]byte("kv@w1"), be(seq), payload)); err != nil {
		p.t.Fatal(err)
	}
}

// restart starts the publisher's count again, as a restarted engine's does.
func (p *publisher) restart() {
	p.mu.Lock()
	p.seq = 0
	clear(p.buffer)
	p.mu.Unlock()
}

// subscribe runs a subscriber of p into a fresh index until the test ends, and waits until it
// hears the publisher: batch 0, a clear, is sent again until it arrives (a SUB socket misses what
// was sent before it joined; the repeats are duplicates to it).
func subscribe(t *testing.T, p *publisher) (*Subscriber, *Index) {
	t.Helper()
	x := NewIndex(1 << 20)
	s := NewSubscriber(Source{Worker: "w1", Model: "m", Endpoint: p.endpoint, Replay: p.replay, Topic: "kv@"}, x, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	p.send(encodeArrays(t, nil, wireCleared{}), false)
	waitUntil(t, "the subscriber to hear the publisher", func() bool {
		if s.Stats.Batches.Load() > 0 {
			return true
		}
		p.resend(0)
		return false
	})
	return s, x
}

// waitUntil polls cond every 20 ms for at most 10 seconds.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// stores returns a batch storing n blocks after parent (nil: a first block), hashes base+1 … .
func stores(t *testing.T, parent any, base, n int) []byte {
	hashes := make([]any, n)
	for i := range hashes {
		hashes[i] = base + i + 1
	}
	return encodeMaps(t, 0, wireStored{hashes: hashes, parent: parent, tokens: seq(base*bs, n*bs), blockSize: bs, medium: "GPU"})
}

func keysOf(base, n int) []uint64 { return Keys("m", "", "", u32(seq(base*bs, n*bs)), bs) }

func TestSubscriberIndexesWhatTheEngineStores(t *testing.T) {
	p := newPublisher(t, false)
	s, x := subscribe(t, p)
	p.send(stores(t, nil, 0, 2), false)
	p.send(stores(t, 2, 2, 2), false)
	waitUntil(t, "four blocks indexed", func() bool { return x.Blocks("w1") == 4 })
	if m := x.Match("w1", keysOf(0, 4)); m.Blocks != 4 {
		t.Fatalf("%+v, want 4 blocks", m)
	}
	if !s.Complete() || s.Stats.Gaps.Load() != 0 || s.Stats.Events.Load() < 3 || s.Stats.LastEvent().IsZero() {
		t.Fatalf("complete %v, gaps %d, events %d", s.Complete(), s.Stats.Gaps.Load(), s.Stats.Events.Load())
	}
}

func TestSubscriberRepairsADroppedBatchByReplay(t *testing.T) {
	p := newPublisher(t, true)
	s, x := subscribe(t, p)
	p.send(stores(t, nil, 0, 2), false)
	p.send(stores(t, 2, 2, 2), true) // dropped from the stream
	p.send(stores(t, 4, 4, 2), false)
	waitUntil(t, "six blocks indexed", func() bool { return x.Blocks("w1") == 6 })
	if m := x.Match("w1", keysOf(0, 6)); m.Blocks != 6 {
		t.Fatalf("%+v, want all 6 blocks, the dropped batch's among them", m)
	}
	if s.Stats.Gaps.Load() != 1 || s.Stats.Replays.Load() != 1 || s.Stats.Resyncs.Load() != 0 || !s.Complete() {
		t.Fatalf("gaps %d replays %d resyncs %d complete %v, want 1 1 0 true",
			s.Stats.Gaps.Load(), s.Stats.Replays.Load(), s.Stats.Resyncs.Load(), s.Complete())
	}
}

func TestSubscriberWithoutReplayForgetsTheWorkerOnAGap(t *testing.T) {
	p := newPublisher(t, false)
	s, x := subscribe(t, p)
	p.send(stores(t, nil, 0, 2), false)
	waitUntil(t, "two blocks indexed", func() bool { return x.Blocks("w1") == 2 })
	p.send(encodeArrays(t, nil, wireRemoved{hashes: []any{1, 2}}), true) // dropped: the index would go on crediting them
	p.send(stores(t, nil, 10, 1), false)
	waitUntil(t, "the gap to be seen", func() bool { return s.Stats.Gaps.Load() == 1 })
	if m := x.Match("w1", keysOf(0, 2)); m.Blocks != 0 {
		t.Fatalf("after an unrepaired gap the worker is still credited with %+v", m)
	}
	if x.Blocks("w1") != 1 || s.Complete() || s.Stats.Resyncs.Load() != 1 {
		t.Fatalf("%d blocks, complete %v, resyncs %d: want the batch after the gap alone, incomplete", x.Blocks("w1"), s.Complete(), s.Stats.Resyncs.Load())
	}
}

func TestSubscriberForgetsTheWorkerWhenItsPublisherRestarts(t *testing.T) {
	p := newPublisher(t, false)
	s, x := subscribe(t, p)
	p.send(stores(t, nil, 0, 2), false)
	p.send(stores(t, 2, 2, 2), false)
	waitUntil(t, "four blocks indexed", func() bool { return x.Blocks("w1") == 4 })
	p.restart()
	p.send(stores(t, nil, 20, 1), false)
	waitUntil(t, "the restart to be seen", func() bool { return s.Stats.Restarts.Load() == 1 })
	if x.Blocks("w1") != 1 || x.Match("w1", keysOf(0, 4)).Blocks != 0 || !s.Complete() {
		t.Fatalf("%d blocks, complete %v: want only the new engine's block, complete from its first batch", x.Blocks("w1"), s.Complete())
	}
}

func TestSubscriberCountsGarbageAndKeepsGoing(t *testing.T) {
	p := newPublisher(t, false)
	s, x := subscribe(t, p)
	p.send([]byte("not msgpack at all"), false)
	p.send(stores(t, nil, 0, 1), false)
	waitUntil(t, "the block after the garbage", func() bool { return x.Blocks("w1") == 1 })
	if s.Stats.DecodeErrors.Load() != 1 {
		t.Fatalf("decode errors %d, want 1", s.Stats.DecodeErrors.Load())
	}
}
