package kvevents

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// subscribe runs a subscriber of p into a fresh index until the test ends, and waits until it
// hears the publisher: batch 0, a clear, is sent again until it arrives (a SUB socket misses what
// was sent before it joined; the repeats are duplicates to it).
func subscribe(t *testing.T, p *kvtest.Publisher) (*Subscriber, *Index) {
	t.Helper()
	x := NewIndex(1 << 20)
	s := NewSubscriber(Source{Worker: "w1", Model: "m", Endpoint: p.Endpoint, Replay: p.Replay, Topic: "kv@"}, x, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	p.Send(encodeArrays(t, nil, wireCleared{}), false)
	testkit.WaitFor(t, "the subscriber to hear the publisher", func() bool {
		if s.Stats.Batches.Load() > 0 {
			return true
		}
		p.Resend(0)
		return false
	})
	return s, x
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

// storeFourBlocks has the engine behind p store the chain of blocks 0 to 3, in two batches of two,
// and waits until x indexes all four for w1: the common start of the tests of what a subscriber
// does with a worker it already knows.
func storeFourBlocks(t *testing.T, p *kvtest.Publisher, x *Index) {
	t.Helper()
	p.Send(stores(t, nil, 0, 2), false)
	p.Send(stores(t, 2, 2, 2), false)
	testkit.WaitFor(t, "four blocks indexed", func() bool { return x.Blocks("w1") == 4 })
}

func TestSubscriberIndexesWhatTheEngineStores(t *testing.T) {
	p := kvtest.New(t, "", false)
	s, x := subscribe(t, p)
	storeFourBlocks(t, p, x)
	if m := x.Match("w1", keysOf(0, 4)); m.Blocks != 4 {
		t.Fatalf("%+v, want 4 blocks", m)
	}
	if !s.Complete() || s.Stats.Gaps.Load() != 0 || s.Stats.Events.Load() < 3 || s.Stats.LastEvent().IsZero() {
		t.Fatalf("complete %v, gaps %d, events %d", s.Complete(), s.Stats.Gaps.Load(), s.Stats.Events.Load())
	}
}

func TestSubscriberRepairsADroppedBatchByReplay(t *testing.T) {
	p := kvtest.New(t, "", true)
	s, x := subscribe(t, p)
	p.Send(stores(t, nil, 0, 2), false)
	p.Send(stores(t, 2, 2, 2), true) // dropped from the stream
	p.Send(stores(t, 4, 4, 2), false)
	testkit.WaitFor(t, "six blocks indexed", func() bool { return x.Blocks("w1") == 6 })
	if m := x.Match("w1", keysOf(0, 6)); m.Blocks != 6 {
		t.Fatalf("%+v, want all 6 blocks, the dropped batch's among them", m)
	}
	if s.Stats.Gaps.Load() != 1 || s.Stats.Replays.Load() != 1 || s.Stats.Resyncs.Load() != 0 || !s.Complete() {
		t.Fatalf("gaps %d replays %d resyncs %d complete %v, want 1 1 0 true",
			s.Stats.Gaps.Load(), s.Stats.Replays.Load(), s.Stats.Resyncs.Load(), s.Complete())
	}
}

func TestSubscriberWithoutReplayForgetsTheWorkerOnAGap(t *testing.T) {
	p := kvtest.New(t, "", false)
	s, x := subscribe(t, p)
	p.Send(stores(t, nil, 0, 2), false)
	testkit.WaitFor(t, "two blocks indexed", func() bool { return x.Blocks("w1") == 2 })
	p.Send(encodeArrays(t, nil, wireRemoved{hashes: []any{1, 2}}), true) // dropped: the index would go on crediting them
	p.Send(stores(t, nil, 10, 1), false)
	testkit.WaitFor(t, "the gap to be seen", func() bool { return s.Stats.Gaps.Load() == 1 })
	if m := x.Match("w1", keysOf(0, 2)); m.Blocks != 0 {
		t.Fatalf("after an unrepaired gap the worker is still credited with %+v", m)
	}
	if x.Blocks("w1") != 1 || s.Complete() || s.Stats.Resyncs.Load() != 1 {
		t.Fatalf("%d blocks, complete %v, resyncs %d: want the batch after the gap alone, incomplete", x.Blocks("w1"), s.Complete(), s.Stats.Resyncs.Load())
	}
}

func TestSubscriberForgetsTheWorkerWhenItsPublisherRestarts(t *testing.T) {
	p := kvtest.New(t, "", false)
	s, x := subscribe(t, p)
	storeFourBlocks(t, p, x)
	p.Restart()
	p.Send(stores(t, nil, 20, 1), false)
	testkit.WaitFor(t, "the restart to be seen", func() bool { return s.Stats.Restarts.Load() == 1 })
	if x.Blocks("w1") != 1 || x.Match("w1", keysOf(0, 4)).Blocks != 0 || !s.Complete() {
		t.Fatalf("%d blocks, complete %v: want only the new engine's block, complete from its first batch", x.Blocks("w1"), s.Complete())
	}
}

func TestSubscriberCountsGarbageAndKeepsGoing(t *testing.T) {
	p := kvtest.New(t, "", false)
	s, x := subscribe(t, p)
	p.Send([]byte("not msgpack at all"), false)
	p.Send(stores(t, nil, 0, 1), false)
	testkit.WaitFor(t, "the block after the garbage", func() bool { return x.Blocks("w1") == 1 })
	if s.Stats.DecodeErrors.Load() != 1 {
		t.Fatalf("decode errors %d, want 1", s.Stats.DecodeErrors.Load())
	}
}

// publishChain publishes n batches of two blocks each, batch i extending batch i-1, starting at block
// base; drop keeps them from the stream. It returns the next block number.
func publishChain(t *testing.T, p *kvtest.Publisher, base, n int, drop bool) int {
	for range n {
		var parent any
		if base > 0 {
			parent = base
		}
		p.Send(stores(t, parent, base, 2), drop)
		base += 2
	}
	return base
}

// join runs a subscriber of p that joins after the publisher sent batches 0..live-1 and waits
// until it has taken batch live, the first it hears.
func join(t *testing.T, p *kvtest.Publisher, live int64) (*Subscriber, *Index) {
	t.Helper()
	s, x := run(t, Source{Worker: "w1", Model: "m", Endpoint: p.Endpoint, Replay: p.Replay, Topic: "kv@"})
	hearFirst(t, s, p, live)
	return s, x
}

// run runs a subscriber of src into a fresh index until the test ends.
func run(t *testing.T, src Source) (*Subscriber, *Index) {
	x := NewIndex(1 << 20)
	s := NewSubscriber(src, x, nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return s, x
}

// hearFirst sends batch live until s counts a repeat of it as a duplicate, which it does only
// once the first message it heard is handled.
func hearFirst(t *testing.T, s *Subscriber, p *kvtest.Publisher, live int64) {
	t.Helper()
	testkit.WaitFor(t, "the subscriber to handle the first batch it hears", func() bool {
		if s.Stats.Duplicates.Load() > 0 {
			return true
		}
		p.Resend(live)
		return false
	})
}

func TestSubscriberJoiningLateReplaysTheBatchesItMissed(t *testing.T) {
	for _, missed := range []int{5, 40, 100} {
		t.Run(strconv.Itoa(missed), func(t *testing.T) {
			p := kvtest.New(t, "", true)
			next := publishChain(t, p, 0, missed, true) // sent before the subscriber listened
			publishChain(t, p, next, 1, true)           // the first it hears, once join sends it
			s, x := join(t, p, int64(missed))
			want := 2 * (missed + 1)
			if x.Blocks("w1") != want || x.Match("w1", keysOf(0, want)).Blocks != want {
				t.Fatalf("%d blocks indexed, match %+v, want all %d", x.Blocks("w1"), x.Match("w1", keysOf(0, want)), want)
			}
			if !s.Complete() || s.Stats.Replays.Load() != 1 || s.Stats.Batches.Load() != int64(missed+1) {
				t.Fatalf("complete %v, replays %d, batches %d: want true, 1, %d",
					s.Complete(), s.Stats.Replays.Load(), s.Stats.Batches.Load(), missed+1)
			}
		})
	}
}

// publishRoots publishes n batches of one first block each (no parent), blocks base+1 … base+n;
// drop keeps them from the stream.
func publishRoots(t *testing.T, p *kvtest.Publisher, base, n int, drop bool) {
	for i := range n {
		p.Send(stores(t, nil, base+i, 1), drop)
	}
}

func TestSubscriberJoiningLateTakesWhatTheReplayBufferStillHolds(t *testing.T) {
	p := kvtest.New(t, "", true)
	publishRoots(t, p, 0, 40, true) // sent before the subscriber listened
	publishRoots(t, p, 40, 1, true) // the first it hears, once join sends it
	p.Keep(11)                      // the engine holds batches 30..40 alone, as a long-running one does
	s, x := join(t, p, 40)
	for b := range 41 {
		want := 0
		if b >= 30 {
			want = 1
		}
		if m := x.Match("w1", keysOf(b, 1)); m.Blocks != want {
			t.Fatalf("block of batch %d: %d matched, want %d (batches 30..40 the replay and the stream brought)", b, m.Blocks, want)
		}
	}
	if s.Complete() || s.Stats.Replays.Load() != 1 || s.Stats.Batches.Load() != 11 || s.Stats.Resyncs.Load() != 0 {
		t.Fatalf("complete %v, replays %d, batches %d, resyncs %d: want false (batches 0..29 are gone), 1, 11, 0",
			s.Complete(), s.Stats.Replays.Load(), s.Stats.Batches.Load(), s.Stats.Resyncs.Load())
	}
}

func TestSubscriberForgetsTheWorkerWhenTheReplayBeginsPastTheGapAndKeepsWhatItBrought(t *testing.T) {
	p := kvtest.New(t, "", true)
	s, x := subscribe(t, p)
	publishRoots(t, p, 0, 1, false) // batch 1
	testkit.WaitFor(t, "the first block indexed", func() bool { return x.Blocks("w1") == 1 })
	publishRoots(t, p, 1, 5, true) // batches 2..6, dropped from the stream
	p.Keep(3)                      // and 2 and 3 gone from the engine's buffer too
	publishRoots(t, p, 6, 1, false)
	testkit.WaitFor(t, "the batch after the gap", func() bool { return x.Match("w1", keysOf(6, 1)).Blocks == 1 })
	for b, want := range []int{0, 0, 0, 1, 1, 1} {
		if m := x.Match("w1", keysOf(b, 1)); m.Blocks != want {
			t.Fatalf("block %d: %d matched, want %d: the index forgotten, then batches 4..6 from the replay", b, m.Blocks, want)
		}
	}
	if s.Complete() || s.Stats.Gaps.Load() != 1 || s.Stats.Replays.Load() != 1 || s.Stats.Resyncs.Load() != 1 {
		t.Fatalf("complete %v, gaps %d, replays %d, resyncs %d: want false, 1, 1, 1",
			s.Complete(), s.Stats.Gaps.Load(), s.Stats.Replays.Load(), s.Stats.Resyncs.Load())
	}
}

// silentListener accepts TCP connections on loopback and never answers on them, as a port held
// by something that is not a replay socket, or an engine too busy to speak, does. closeAll
// closes the listener and what it accepted.
func silentListener(t *testing.T) (endpoint string, closeAll func()) {
	ln := testkit.Listen(t)
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return "tcp://" + ln.Addr().String(), func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	}
}

func TestSubscriberGivesUpAReplayWhoseEndpointNeverAnswers(t *testing.T) {
	p := kvtest.New(t, "", false)
	publishRoots(t, p, 0, 5, true)
	publishRoots(t, p, 5, 1, true)
	replay, closeAll := silentListener(t)
	s, x := run(t, Source{Worker: "w1", Model: "m", Endpoint: p.Endpoint, Replay: replay, Topic: "kv@"})
	t.Cleanup(closeAll) // before the subscriber's cleanup, which waits for it to stop
	hearFirst(t, s, p, 5)
	if x.Match("w1", keysOf(5, 1)).Blocks != 1 || s.Complete() || s.Stats.Replays.Load() != 1 {
		t.Fatalf("match %+v, complete %v, replays %d: want the batch heard applied once the replay was given up, incomplete",
			x.Match("w1", keysOf(5, 1)), s.Complete(), s.Stats.Replays.Load())
	}
}

// A subscriber whose events endpoint accepts the connection and never speaks stops when told to,
// rather than waiting in the handshake for ever.
func TestSubscriberStopsWhileItsEndpointNeverAnswers(t *testing.T) {
	ln := testkit.Listen(t)
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	s := NewSubscriber(Source{Worker: "w1", Model: "m", Endpoint: "tcp://" + ln.Addr().String()}, NewIndex(1<<20), nil)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	select {
	case c := <-accepted: // the subscriber is in the handshake, which this end never answers
		defer c.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the subscriber never dialled")
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the subscriber did not stop: it is held in the handshake with a silent endpoint")
	}
}

// A worker whose batches store only blocks after a parent the router never saw indexes nothing
// while batches, events and sequence numbers all look healthy: its orphaned blocks are counted,
// and it is logged once a minute into such a run, and again only after blocks were indexed
// in between.
func TestSubscriberCountsOrphansAndLogsOnceWhenItsEventsIndexNothing(t *testing.T) {
	var logs bytes.Buffer
	s := NewSubscriber(Source{Worker: "w1", Model: "m"}, NewIndex(1<<20), slog.New(slog.NewTextHandler(&logs, nil)))
	clock := time.Unix(1_700_000_000, 0)
	s.now = func() time.Time { return clock }
	var next int64
	send := func(payload []byte) {
		s.receive(context.Background(), [][]byte{[]byte("kv@"), kvtest.BigEndian(next), payload})
		next++
		clock = clock.Add(10 * time.Second)
	}
	logged := func() int { return strings.Count(logs.String(), "indexed none") }
	for range 6 { // 0 s to 50 s
		send(stores(t, 999_999, 0, 2))
	}
	if logged() != 0 || s.Stats.Orphans.Load() != 12 {
		t.Fatalf("after 50 s: logged %d times, %d orphans; want 0 and 12", logged(), s.Stats.Orphans.Load())
	}
	for range 6 { // 60 s to 110 s
		send(stores(t, 999_999, 0, 2))
	}
	if logged() != 1 {
		t.Fatalf("after a minute and more of orphans: logged %d times, want once\n%s", logged(), logs.String())
	}
	send(stores(t, nil, 100, 1)) // a first block: indexed
	for range 7 {
		send(stores(t, 999_999, 0, 2))
	}
	if logged() != 2 || s.Stats.Orphans.Load() != 38 {
		t.Fatalf("a second run of orphans after an indexed block: logged %d times, %d orphans; want 2 and 38", logged(), s.Stats.Orphans.Load())
	}
	if st := s.status("w1", "", s.index); st.Orphans != 38 || st.Blocks != 1 {
		t.Fatalf("status %+v, want 38 orphans and 1 block", st)
	}
}

// A replay's run holds at most maxReplayBytes of payloads before they are applied: past it the
// oldest are let go and the run starts after them, as when the engine no longer holds them. A
// replay endpoint could otherwise make the router hold all it can send in the replay's 2 s.
func TestReplayRunKeepsItsNewestWithinItsBound(t *testing.T) {
	payload := make([]byte, maxReplayBytes/5) // five fit, six do not
	r := replayRun{first: 10, next: 10}
	for seq := int64(10); seq < 16; seq++ {
		r.add(seq, payload)
	}
	if r.first != 11 || r.next != 16 || len(r.payloads) != 5 || r.bytes != 5*len(payload) {
		t.Fatalf("run %d..%d of %d payloads, %d bytes; want 11..15, the newest five", r.first, r.next-1, len(r.payloads), r.bytes)
	}
	r.add(20, payload[:1]) // the engine no longer held 16..19
	if r.first != 20 || len(r.payloads) != 1 || r.bytes != 1 {
		t.Fatalf("after a hole: run from %d of %d payloads, %d bytes; want 20 alone", r.first, len(r.payloads), r.bytes)
	}
}
