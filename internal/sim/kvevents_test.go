package sim

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"net"
	"net/http"
	"reflect"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/kvevents/kvtest"
	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// The tests below run the worker's publisher on real ZMQ sockets on loopback and read what it
// sends with kvevents' decoder, its subscriber and its index: the router's own reading of vLLM's
// wire format.

// eventsConfig is a small, never-sleeping worker that publishes on a bound loopback endpoint
// with a replay socket.
func eventsConfig(t testing.TB, encoding string) Config {
	cfg := testConfig()
	cfg.BlockSize = 4
	cfg.KVEvents = KVEventsConfig{Endpoint: kvtest.FreeEndpoint(t), Bind: true, ReplayEndpoint: kvtest.FreeEndpoint(t), Topic: "kv@sim", Encoding: encoding}
	return cfg
}

type heardBatch struct {
	seq   int64
	topic string
	batch kvevents.Batch
}

// heard is what a SUB socket received, decoded.
type heard struct {
	mu      sync.Mutex
	batches []heardBatch
	errs    int
}

func (h *heard) list() []heardBatch {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]heardBatch(nil), h.batches...)
}

// subscribeRaw reads endpoint with a SUB socket, dialling it, or binding it when bind is set (for
// a publisher that dials), until the test ends.
func subscribeRaw(t *testing.T, endpoint, topic string, bind bool) *heard {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx, zmq4.WithDialerRetry(50*time.Millisecond))
	var err error
	if bind {
		err = sub.Listen(endpoint)
	} else {
		err = sub.Dial(endpoint)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, topic); err != nil {
		t.Fatal(err)
	}
	h := &heard{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		dec := kvevents.NewDecoder()
		for {
			msg, err := sub.Recv()
			if err != nil {
				return
			}
			h.mu.Lock()
			if len(msg.Frames) != 3 || len(msg.Frames[1]) != 8 {
				h.errs++
			} else if b, err := dec.Decode(msg.Frames[2]); err != nil {
				h.errs++
			} else {
				h.batches = append(h.batches, heardBatch{int64(binary.BigEndian.Uint64(msg.Frames[1])), string(msg.Frames[0]), b})
			}
			h.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); sub.Close(); <-done })
	return h
}

// join waits until h hears w: a SUB socket misses what was sent before it joined, so the cache is
// reset (an AllBlocksCleared each time) until one arrives.
func join(t *testing.T, w *Worker, h *heard) {
	t.Helper()
	waitUntilEvery(t, "the subscriber to hear the worker", 20*time.Millisecond, func() bool {
		if len(h.list()) > 0 {
			return true
		}
		w.ResetPrefixCache()
		return false
	})
}

// sealed reports whether every event the worker's cache produced is in a numbered batch, and
// returns the last number.
func sealed(w *Worker) (int64, bool) {
	p := w.events
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next - 1, len(p.cur) == 0
}

// hearAll waits until h has heard every batch the worker numbered.
func hearAll(t *testing.T, w *Worker, h *heard) []heardBatch {
	t.Helper()
	var got []heardBatch
	waitUntilEvery(t, "every batch to arrive", 10*time.Millisecond, func() bool {
		last, ok := sealed(w)
		got = h.list()
		return ok && len(got) > 0 && got[len(got)-1].seq == last
	})
	return got
}

// waitUntilEvery is testkit.WaitFor with cond called every every: conds here publish or
// subscribe, and a pace keeps them from flooding the worker.
func waitUntilEvery(t *testing.T, what string, every time.Duration, cond func() bool) {
	t.Helper()
	if !testkit.Poll(testkit.Patience, every, cond) {
		t.Fatalf("timed out waiting for %s", what)
	}
}

// live replays events into the set of engine hashes stored and not removed since the last clear,
// failing on a removal of a block not live.
func live(t *testing.T, batches []heardBatch) (map[kvevents.Hash]bool, int, int) {
	t.Helper()
	set := map[kvevents.Hash]bool{}
	stored, removed := 0, 0
	for _, hb := range batches {
		for _, e := range hb.batch.Events {
			switch e.Kind {
			case kvevents.Cleared:
				clear(set)
			case kvevents.Stored:
				if e.HasParent && !set[e.Parent] {
					t.Fatalf("batch %d stores blocks after parent %x, which is not in the cache", hb.seq, e.Parent)
				}
				if len(e.TokenIDs) != len(e.BlockHashes)*e.BlockSize || e.BlockSize != 4 || e.Offloaded {
					t.Fatalf("batch %d: %d tokens for %d blocks of %d, offloaded %v", hb.seq, len(e.TokenIDs), len(e.BlockHashes), e.BlockSize, e.Offloaded)
				}
				for _, h := range e.BlockHashes {
					set[h] = true
					stored++
				}
			case kvevents.Removed:
				for _, h := range e.BlockHashes {
					if !set[h] {
						t.Fatalf("batch %d removes block %x, which is not in the cache", hb.seq, h)
					}
					delete(set, h)
					removed++
				}
			}
		}
	}
	return set, stored, removed
}

func TestKVEvents_StoresAndEvictionsMirrorTheCache(t *testing.T) {
	cfg := eventsConfig(t, KVEncodingArray)
	cfg.KVCacheBlocks = 24 // a conversation of about 15 blocks: the second evicts the first
	w := newWorker(t, cfg)
	h := subscribeRaw(t, cfg.KVEvents.Endpoint, "kv@", false)
	join(t, w, h)
	for i := range 4 {
		chat(t, w, []msg{{"user", words(strconv.Itoa(i), 160)}}, 8)
	}
	got := hearAll(t, w, h)
	set, stored, removed := live(t, got)
	if stored == 0 || removed == 0 {
		t.Fatalf("%d blocks stored, %d removed: want both with a cache this small", stored, removed)
	}
	w.eng.mu.Lock()
	resident := w.eng.cache.Resident()
	for hash := range set {
		if !w.eng.cache.Contains(uint64(hash)) {
			t.Errorf("block %x published as stored is not in the cache", hash)
		}
	}
	w.eng.mu.Unlock()
	if len(set) != resident {
		t.Fatalf("the events leave %d blocks in the cache, the cache holds %d", len(set), resident)
	}
	for _, hb := range got {
		if hb.topic != "kv@sim" {
			t.Fatalf("topic %q, want kv@sim", hb.topic)
		}
	}
	if st := w.KVEventStats(); st.Batches == 0 || st.Dropped != 0 || st.Events < int64(len(got)) || st.Bytes == 0 {
		t.Fatalf("stats %+v", st)
	}
}

func TestKVEvents_ResetPublishesAllBlocksCleared(t *testing.T) {
	cfg := eventsConfig(t, KVEncodingMap)
	w := newWorker(t, cfg)
	h := subscribeRaw(t, cfg.KVEvents.Endpoint, "", false)
	join(t, w, h)
	chat(t, w, []msg{{"user", words("reset", 200)}}, 4)
	before := hearAll(t, w, h)
	if set, _, _ := live(t, before); len(set) == 0 {
		t.Fatal("no blocks stored before the reset")
	}
	if rec := do(t, w, http.MethodPost, "/reset_prefix_cache", ""); rec.Code != http.StatusOK {
		t.Fatalf("reset: %d", rec.Code)
	}
	after := hearAll(t, w, h)
	last := after[len(after)-1].batch.Events
	if len(last) == 0 || last[len(last)-1].Kind != kvevents.Cleared {
		t.Fatalf("the last event after the reset is %+v, want AllBlocksCleared", last)
	}
	if set, _, _ := live(t, after); len(set) != 0 {
		t.Fatalf("%d blocks left after the clear", len(set))
	}
}

// replayAll asks the worker's replay socket for every batch from start, as a subscriber that
// missed them does, and decodes them.
func replayAll(t *testing.T, endpoint string, start int64) []heardBatch {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	d := zmq4.NewDealer(ctx)
	defer d.Close()
	if err := d.Dial(endpoint); err != nil {
		t.Fatal(err)
	}
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, seqFrame(start))); err != nil {
		t.Fatal(err)
	}
	dec := kvevents.NewDecoder()
	var out []heardBatch
	for {
		msg, err := d.Recv()
		if err != nil {
			t.Fatalf("replay: %v", err)
		}
		f := msg.Frames
		if len(f) != 3 || len(f[0]) != 0 || len(f[1]) != 8 {
			t.Fatalf("a replay answer of %d frames", len(f))
		}
		seq := int64(binary.BigEndian.Uint64(f[1]))
		if seq == -1 {
			if len(f[2]) != 0 {
				t.Fatal("the end marker carries a payload")
			}
			return out
		}
		b, err := dec.Decode(f[2])
		if err != nil {
			t.Fatalf("replayed batch %d: %v", seq, err)
		}
		out = append(out, heardBatch{seq: seq, batch: b})
	}
}

// eventsOf flattens batches into their events, without the batch timestamps.
func eventsOf(bs []heardBatch) []kvevents.Event {
	var out []kvevents.Event
	for _, b := range bs {
		out = append(out, b.batch.Events...)
	}
	return out
}

func TestKVEvents_BothEncodingsDecodeToTheSameEvents(t *testing.T) {
	var got [2][]kvevents.Event
	for i, enc := range []string{KVEncodingArray, KVEncodingMap} {
		cfg := eventsConfig(t, enc)
		cfg.KVCacheBlocks = 24
		w := newWorker(t, cfg)
		for k := range 3 {
			chat(t, w, []msg{{"system", "be brief"}, {"user", words(strconv.Itoa(k), 150)}}, 8)
		}
		w.ResetPrefixCache()
		waitUntilEvery(t, "the batches to be sealed", 10*time.Millisecond, func() bool { _, ok := sealed(w); return ok })
		bs := replayAll(t, cfg.KVEvents.ReplayEndpoint, 0)
		for k, b := range bs {
			if b.seq != int64(k) {
				t.Fatalf("%s: replayed batch %d has number %d", enc, k, b.seq)
			}
		}
		got[i] = eventsOf(bs)
		if first := got[i][0]; first.Kind != kvevents.Cleared {
			t.Fatalf("%s: the first event is %+v, want the AllBlocksCleared of the start", enc, first)
		}
		if _, stored, removed := live(t, bs); stored == 0 || removed == 0 {
			t.Fatalf("%s: %d stored, %d removed", enc, stored, removed)
		}
	}
	if !reflect.DeepEqual(got[0], got[1]) {
		t.Fatalf("array and map encodings decode to different events:\n%+v\n%+v", got[0], got[1])
	}
}

func TestKVEvents_ReplayAnswersFromTheNumberAsked(t *testing.T) {
	cfg := eventsConfig(t, KVEncodingArray)
	w := newWorker(t, cfg)
	for i := range 3 {
		chat(t, w, []msg{{"user", words(strconv.Itoa(i), 100)}}, 4)
		waitUntilEvery(t, "a batch per request", 10*time.Millisecond, func() bool { _, ok := sealed(w); return ok })
	}
	last, _ := sealed(w)
	if last < 3 {
		t.Fatalf("%d batches numbered, want at least 4", last+1)
	}
	bs := replayAll(t, cfg.KVEvents.ReplayEndpoint, 2)
	if len(bs) != int(last-1) || bs[0].seq != 2 || bs[len(bs)-1].seq != last {
		t.Fatalf("replay from 2 answered %d batches, first %d: want 2..%d", len(bs), bs[0].seq, last)
	}
	if bs := replayAll(t, cfg.KVEvents.ReplayEndpoint, last+1); len(bs) != 0 {
		t.Fatalf("replay past the end answered %d batches, want only the end marker", len(bs))
	}
}

func TestKVEvents_DialsAnEndpointWithoutWildcard(t *testing.T) {
	cfg := testConfig()
	cfg.BlockSize = 4
	cfg.KVEvents = KVEventsConfig{Endpoint: kvtest.FreeEndpoint(t)}
	h := subscribeRaw(t, cfg.KVEvents.Endpoint, "", true) // the subscriber binds, the worker dials
	w := newWorker(t, cfg)
	join(t, w, h)
	chat(t, w, []msg{{"user", words("dial", 100)}}, 4)
	if set, stored, _ := live(t, hearAll(t, w, h)); stored == 0 || len(set) == 0 {
		t.Fatal("nothing stored heard over the dialled connection")
	}
}

func TestKVEvents_BindsOrDialsAsVLLMDecides(t *testing.T) {
	for ep, bind := range map[string]bool{
		"tcp://*:5557": true, "tcp://[::]:5557": true, "ipc:///tmp/kv": true, "inproc://kv": true,
		"tcp://127.0.0.1:5557": false, "tcp://router.local:5557": false,
	} {
		if binds(ep) != bind {
			t.Errorf("binds(%q) = %v, want %v", ep, !bind, bind)
		}
	}
}

func TestKVEvents_EndpointsAreOffsetPerWorker(t *testing.T) {
	c, err := KVEventsConfig{Endpoint: "tcp://*:5557", ReplayEndpoint: "tcp://*:5600"}.Offset(2)
	if err != nil || c.Endpoint != "tcp://*:5559" || c.ReplayEndpoint != "tcp://*:5602" {
		t.Fatalf("%+v %v", c, err)
	}
	if c, _ := (KVEventsConfig{Endpoint: "ipc:///tmp/kv"}).Offset(1); c.Endpoint != "ipc:///tmp/kv_dp1" {
		t.Fatalf("ipc offset: %q", c.Endpoint)
	}
	if _, err := (KVEventsConfig{Endpoint: "tcp://*:65535"}).Offset(1); err == nil {
		t.Fatal("a port past 65535 was accepted")
	}
}

func TestKVEvents_AFullQueueDropsABatchButKeepsItsNumberForReplay(t *testing.T) {
	// No sender runs: the queue of one fills with the first batch.
	p := &eventPublisher{cfg: KVEventsConfig{BufferSteps: 3}, blockSize: 4, sendq: make(chan *pubBatch, 1)}
	for range 5 {
		p.add(kvEvent{kind: kvcache.Cleared})
		p.mu.Lock()
		p.seal()
		p.mu.Unlock()
	}
	if p.batches.Load() != 5 || p.dropped.Load() != 4 {
		t.Fatalf("%d batches, %d dropped: want 5 and 4", p.batches.Load(), p.dropped.Load())
	}
	var seqs []int64
	for _, b := range p.buffered(0) {
		seqs = append(seqs, b.seq)
	}
	if !reflect.DeepEqual(seqs, []int64{2, 3, 4}) {
		t.Fatalf("the replay buffer of 3 holds %v, want the last three numbers 2 3 4", seqs)
	}
}

// subscribeTo runs a kvevents subscriber of w's publisher into a fresh index until the test ends,
// and waits until it hears w: each reset publishes an AllBlocksCleared, until one arrives.
func subscribeTo(t *testing.T, w *Worker, cfg Config) (*kvevents.Subscriber, *kvevents.Index) {
	t.Helper()
	x := kvevents.NewIndex(1 << 20)
	s := kvevents.NewSubscriber(kvevents.Source{Worker: "w", Model: "sim-model", Endpoint: cfg.KVEvents.Endpoint,
		Replay: cfg.KVEvents.ReplayEndpoint, Topic: "kv@"}, x, nil)
	runSubscriber(t, s)
	waitUntilEvery(t, "the subscriber to hear the worker", 20*time.Millisecond, func() bool {
		if s.Stats.Batches.Load() > 0 {
			return true
		}
		w.ResetPrefixCache()
		return false
	})
	return s, x
}

func TestKVEvents_ASkippedBatchIsRepairedByReplay(t *testing.T) {
	cfg := eventsConfig(t, KVEncodingArray)
	w := newWorker(t, cfg)
	s, x := subscribeTo(t, w, cfg)
	next, _ := sealed(w)
	skipped := next + 1
	skip := func(seq int64) bool { return seq == skipped }
	w.events.skip.Store(&skip)
	msgs := []msg{{"user", words("gap", 120)}}
	chat(t, w, msgs, 4) // its stores are the skipped batch
	waitUntilEvery(t, "the stores to be sealed", 10*time.Millisecond, func() bool { l, ok := sealed(w); return ok && l >= skipped })
	chat(t, w, []msg{{"user", words("after", 120)}}, 4) // the batch after the gap
	keys := kvevents.Keys("sim-model", "", "", tokenize(t, w, msgs), cfg.BlockSize)
	// Only the replay can have brought the skipped batch's blocks: without it the gap would
	// have made the subscriber forget the worker.
	waitUntilEvery(t, "the gap to be repaired", 10*time.Millisecond, func() bool {
		return s.Stats.Replays.Load() > 0 && x.Match("w", keys).Blocks == len(keys)
	})
	if s.Stats.Gaps.Load() != 1 || s.Stats.Resyncs.Load() != 0 || !s.Complete() || w.KVEventStats().Dropped != 1 {
		t.Fatalf("gaps %d resyncs %d complete %v dropped %d: want 1 0 true 1", s.Stats.Gaps.Load(), s.Stats.Resyncs.Load(), s.Complete(), w.KVEventStats().Dropped)
	}
}

func runSubscriber(t *testing.T, s *kvevents.Subscriber) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// tokenize asks the worker's /tokenize for the tokens of a chat conversation.
func tokenize(t *testing.T, w *Worker, msgs []msg) []uint32 {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs})
	rec := do(t, w, http.MethodPost, "/tokenize", string(b))
	if rec.Code != http.StatusOK {
		t.Fatalf("tokenize: %d %s", rec.Code, rec.Body)
	}
	var r struct {
		Count       int      `json:"count"`
		MaxModelLen int      `json:"max_model_len"`
		Tokens      []uint32 `json:"tokens"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	if r.Count != len(r.Tokens) || r.MaxModelLen != w.maxModelLen() {
		t.Fatalf("count %d for %d tokens, max_model_len %d", r.Count, len(r.Tokens), r.MaxModelLen)
	}
	return r.Tokens
}

// TestKVEvents_TokenizeKeysMatchThePublishedBlocks is the router's whole path: a chat served by
// the worker, its BlockStored events applied to an index by a subscriber over loopback ZMQ, and
// the worker's /tokenize tokens of the same messages chained into keys that the index matches,
// every full block of the prompt; the next turn matches the first turn's reply blocks too.
func TestKVEvents_TokenizeKeysMatchThePublishedBlocks(t *testing.T) {
	cfg := eventsConfig(t, KVEncodingArray)
	w := newWorker(t, cfg)
	_, x := subscribeTo(t, w, cfg)

	turn1 := []msg{{"system", "You are terse."}, {"user", words("Find the bug in main.go.", 300)}}
	tools := `[{"type":"function","function":{"name":"read","parameters":{"type":"object"}}}]`
	body := func(msgs []msg) string {
		b, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "tools": json.RawMessage(tools), "max_tokens": 12, "ignore_eos": true})
		return string(b)
	}
	tokens := func(msgs []msg) []uint32 {
		b, _ := json.Marshal(map[string]any{"model": "sim-model", "messages": msgs, "tools": json.RawMessage(tools), "add_generation_prompt": true})
		rec := do(t, w, http.MethodPost, "/tokenize", string(b))
		var r struct{ Tokens []uint32 }
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &r) != nil {
			t.Fatalf("tokenize: %d %s", rec.Code, rec.Body)
		}
		rec = do(t, w, http.MethodPost, "/v1/chat/completions/render", body(msgs))
		var rr struct {
			TokenIDs []uint32 `json:"token_ids"`
		}
		if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &rr) != nil || !reflect.DeepEqual(rr.TokenIDs, r.Tokens) {
			t.Fatalf("render: %d, its tokens differ from /tokenize's", rec.Code)
		}
		return r.Tokens
	}

	rec := do(t, w, http.MethodPost, "/v1/chat/completions", body(turn1))
	var reply chatReply
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &reply) != nil {
		t.Fatalf("chat: %d %s", rec.Code, rec.Body)
	}
	toks := tokens(turn1)
	if len(toks) != reply.Usage.PromptTokens {
		t.Fatalf("/tokenize gives %d tokens, the chat counted %d", len(toks), reply.Usage.PromptTokens)
	}
	keys := kvevents.Keys("sim-model", "", "", toks, cfg.BlockSize)
	waitUntilEvery(t, "the prompt's blocks to be indexed", 10*time.Millisecond, func() bool {
		return x.Match("w", keys).Blocks == len(keys)
	})
	if m := x.Match("w", keys); m.GPUBlocks != len(keys) || len(keys) < 20 {
		t.Fatalf("%+v of %d keys", m, len(keys))
	}

	// Turn 2 sends the reply back: the cache holds turn 1's prompt, reply and end marker.
	turn2 := append(turn1, msg{"assistant", reply.Choices[0].Message.Content}, msg{"user", "And fix it."})
	keys2 := kvevents.Keys("sim-model", "", "", tokens(turn2), cfg.BlockSize)
	want := (reply.Usage.PromptTokens + reply.Usage.CompletionTokens + 3) / cfg.BlockSize // "<|en" "d|>" "\n"
	waitUntilEvery(t, "the reply's blocks to be indexed", 10*time.Millisecond, func() bool {
		return x.Match("w", keys2).Blocks == want
	})
	if want <= len(keys) || want >= len(keys2) {
		t.Fatalf("turn 2 matches %d of %d blocks, turn 1's prompt had %d", want, len(keys2), len(keys))
	}
}

func TestKVEvents_EachWorkerOfAFleetPublishesOnItsOwnPort(t *testing.T) {
	// Two consecutive free ports, for workers 0 and 1.
	var port int
	for try := 0; ; try++ {
		ln := testkit.Listen(t)
		port = ln.Addr().(*net.TCPAddr).Port
		next, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port+1))
		ln.Close()
		if err == nil {
			next.Close()
			break
		}
		if try == 20 {
			t.Skip("no two consecutive free ports")
		}
	}
	cfg := testConfig()
	cfg.KVEvents = KVEventsConfig{Endpoint: "tcp://127.0.0.1:" + strconv.Itoa(port), Bind: true}
	fleet, err := StartLocal(2, cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer fleet.Close()
	w1 := fleet.Workers()[1]
	if ep := w1.Config().KVEvents.Endpoint; ep != "tcp://127.0.0.1:"+strconv.Itoa(port+1) {
		t.Fatalf("worker 1 publishes on %s", ep)
	}
	h := subscribeRaw(t, w1.Config().KVEvents.Endpoint, "", false)
	join(t, w1, h)
	if w0 := fleet.Workers()[0].KVEventStats(); w0.Batches != 1 {
		t.Fatalf("worker 0 numbered %d batches, want only its start: worker 1's resets are its own", w0.Batches)
	}
}
