package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// kvevents.go publishes the worker's cache model as vLLM publishes its KV cache
// (--kv-events-config): a ZMQ PUB socket sending, per batch, three frames (topic, an 8-byte
// big-endian sequence number counted from 0, a msgpack EventBatch), and an optional ROUTER socket
// that answers a replay request with the batches it still holds. Events are BlockStored when
// blocks become computed (hits for later requests from then on), BlockRemoved when computed
// blocks are evicted, AllBlocksCleared at start and on POST /reset_prefix_cache.
//
// The engine never waits for the network. Under the engine lock, changes are appended to the
// batch being filled; a flusher seals it every KVEventsConfig.Interval (or when it reaches
// maxBatchEvents), gives it the next sequence number, keeps it in the replay buffer and hands
// it to the sender through a bounded queue. A batch that finds the queue full is dropped from
// the stream and counted, but it keeps its number and its place in the replay buffer, so a
// subscriber sees the gap and can fetch it by replay, as it would from vLLM.

// Event encodings, KVEventsConfig.Encoding.
const (
	KVEncodingArray = "array" // msgspec array_like: every struct an array, events tagged by their first element
	KVEncodingMap   = "map"   // every struct a map, events tagged under "type"
)

// KVEventsConfig is where and how a worker publishes KV-cache events. The zero value publishes
// nothing.
type KVEventsConfig struct {
	// Endpoint is the PUB socket's endpoint. As in vLLM, it is bound when it contains "*", "::",
	// ipc:// or inproc:// (tcp://*:5557), and dialled otherwise (tcp://router:5557, for a
	// subscriber that binds); a dialling publisher keeps trying until the subscriber is up.
	// "" publishes nothing.
	Endpoint string
	// Bind binds Endpoint even without a wildcard, to publish on one interface only
	// (tcp://127.0.0.1:5557), which vLLM's rule cannot express.
	Bind bool
	// ReplayEndpoint, when set, is bound by a ROUTER socket that answers replay requests.
	ReplayEndpoint string
	// Topic is the first frame of every message; vLLM's default is empty.
	Topic string
	// Encoding is KVEncodingArray (the default, for "") or KVEncodingMap.
	Encoding string
	// BufferSteps is how many batches the replay buffer keeps; 0 means 10,000, vLLM's default.
	BufferSteps int
	// QueueBatches bounds the batches waiting for the sender; 0 means 1,000.
	QueueBatches int
	// Interval is how often the batch being filled is sealed and sent; 0 means 10 ms.
	Interval time.Duration
}

const (
	defaultBufferSteps  = 10000
	defaultQueueBatches = 1000
	defaultInterval     = 10 * time.Millisecond
	// maxBatchEvents seals a batch early, so that a flood makes more batches, not bigger ones.
	maxBatchEvents = 1024
	// pubHWM bounds the messages the PUB socket itself queues for slow subscribers; past it the
	// socket drops them without telling (those batches stay in the replay buffer too).
	pubHWM = 100000
)

func (c KVEventsConfig) validate() error {
	if c.Endpoint == "" {
		if c.ReplayEndpoint != "" {
			return errors.New("kv events: a replay endpoint needs an endpoint")
		}
		return nil
	}
	var errs []error
	switch c.Encoding {
	case "", KVEncodingArray, KVEncodingMap:
	default:
		errs = append(errs, fmt.Errorf("kv events encoding %q must be array or map", c.Encoding))
	}
	for _, ep := range []string{c.Endpoint, c.ReplayEndpoint} {
		if ep != "" && !strings.Contains(ep, "://") {
			errs = append(errs, fmt.Errorf("kv events endpoint %q must be transport://address", ep))
		}
	}
	if c.BufferSteps < 0 || c.QueueBatches < 0 || c.Interval < 0 {
		errs = append(errs, errors.New("kv events buffer, queue and interval must not be negative"))
	}
	return errors.Join(errs...)
}

// Offset returns c for the worker or data-parallel rank n, as vLLM offsets its endpoints by the
// DP rank: a tcp port grows by n, an ipc or inproc path gets the suffix "_dp<n>".
func (c KVEventsConfig) Offset(n int) (KVEventsConfig, error) {
	var err error
	if c.Endpoint, err = offsetEndpoint(c.Endpoint, n); err != nil {
		return c, err
	}
	c.ReplayEndpoint, err = offsetEndpoint(c.ReplayEndpoint, n)
	return c, err
}

func offsetEndpoint(ep string, n int) (string, error) {
	if ep == "" || n == 0 {
		return ep, nil
	}
	if !strings.HasPrefix(ep, "tcp://") {
		return ep + "_dp" + strconv.Itoa(n), nil
	}
	i := strings.LastIndexByte(ep, ':')
	port, err := strconv.Atoi(ep[i+1:])
	if err != nil || port+n > 65535 {
		return "", fmt.Errorf("kv events endpoint %q: no port to offset by %d", ep, n)
	}
	return ep[:i+1] + strconv.Itoa(port+n), nil
}

// binds reports whether vLLM's publisher binds endpoint rather than dialling it.
func binds(ep string) bool {
	return strings.Contains(ep, "*") || strings.Contains(ep, "::") ||
		strings.HasPrefix(ep, "ipc://") || strings.HasPrefix(ep, "inproc://")
}

// KVEventStats count what a worker's publisher did.
type KVEventStats struct {
	Batches int64 // sealed and numbered, sent or dropped
	Dropped int64 // numbered but not sent: the send queue was full
	Events  int64 // events in the numbered batches
	Replays int64 // replay requests answered
	Bytes   int64 // payload bytes sent on the PUB socket
}

// KVEventStats returns the publisher's counters; zero when the worker publishes nothing.
func (w *Worker) KVEventStats() KVEventStats {
	p := w.events
	if p == nil {
		return KVEventStats{}
	}
	return KVEventStats{Batches: p.batches.Load(), Dropped: p.dropped.Load(), Events: p.nevents.Load(),
		Replays: p.replays.Load(), Bytes: p.bytes.Load()}
}

// kvEvent is one event before encoding.
type kvEvent struct {
	kind      kvcache.ChangeKind
	hashes    []uint64
	parent    uint64
	hasParent bool
	tokens    []uint32
	lora      adapter // the adapter the blocks were computed with; no name for the base model
}

// pubBatch is one numbered batch; its payload is encoded once, by whoever needs it first.
type pubBatch struct {
	seq     int64
	ts      float64
	events  []kvEvent
	once    sync.Once
	payload []byte
}

type eventPublisher struct {
	cfg       KVEventsConfig
	blockSize int
	topic     []byte

	cancel context.CancelFunc
	pub    zmq4.Socket
	router zmq4.Socket
	wg     sync.WaitGroup
	sendq  chan *pubBatch

	mu   sync.Mutex
	cur  []kvEvent
	next int64
	ring []*pubBatch // the replay buffer, oldest first from head
	head int

	batches, dropped, nevents, replays, bytes atomic.Int64

	// skip, in tests, keeps the batches it names from the stream, as a full queue would.
	skip atomic.Pointer[func(seq int64) bool]
}

// startPublisher opens the sockets of cfg and starts publishing, with AllBlocksCleared as batch 0.
func startPublisher(cfg KVEventsConfig, blockSize int) (*eventPublisher, error) {
	if cfg.BufferSteps == 0 {
		cfg.BufferSteps = defaultBufferSteps
	}
	if cfg.QueueBatches == 0 {
		cfg.QueueBatches = defaultQueueBatches
	}
	if cfg.Interval == 0 {
		cfg.Interval = defaultInterval
	}
	if cfg.Encoding == "" {
		cfg.Encoding = KVEncodingArray
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &eventPublisher{cfg: cfg, blockSize: blockSize, topic: []byte(cfg.Topic), cancel: cancel,
		sendq: make(chan *pubBatch, cfg.QueueBatches)}
	bind := cfg.Bind || binds(cfg.Endpoint)
	if bind {
		p.pub = zmq4.NewPub(ctx)
	} else {
		// Reconnecting only when dialling: zmq4 0.17 makes a listening socket with automatic
		// reconnect dial its own endpoint whenever a subscriber leaves.
		p.pub = zmq4.NewPub(ctx, zmq4.WithDialerRetry(250*time.Millisecond), zmq4.WithDialerMaxRetries(-1),
			zmq4.WithAutomaticReconnect(true))
	}
	_ = p.pub.SetOption(zmq4.OptionHWM, pubHWM)
	var err error
	if bind {
		err = p.pub.Listen(cfg.Endpoint)
	} else {
		// Dialled in the background, as a ZMQ connect is: the worker serves meanwhile, and what
		// it publishes before the connection is up is in the replay buffer.
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			if err := p.pub.Dial(cfg.Endpoint); err != nil && ctx.Err() == nil {
				slog.Warn("sim: kv events: dialling failed", "endpoint", cfg.Endpoint, "error", err)
			}
		}()
	}
	if err == nil && cfg.ReplayEndpoint != "" {
		p.router = zmq4.NewRouter(ctx)
		err = p.router.Listen(cfg.ReplayEndpoint)
	}
	if err != nil {
		p.close()
		return nil, fmt.Errorf("sim: kv events: %w", err)
	}
	p.mu.Lock()
	p.cur = append(p.cur, kvEvent{kind: kvcache.Cleared}) // batch 0: the cache starts empty
	p.seal()
	p.mu.Unlock()
	p.wg.Add(2)
	go p.flushLoop(ctx)
	go p.sendLoop(ctx)
	if p.router != nil {
		p.wg.Add(1)
		go p.replayLoop()
	}
	return p, nil
}

// close stops the loops and closes the sockets. Batches not yet sent are not sent.
func (p *eventPublisher) close() {
	p.cancel()
	if p.router != nil {
		p.router.Close()
	}
	p.wg.Wait()
	p.pub.Close()
}

// add appends events to the batch being filled. It never blocks on the network.
func (p *eventPublisher) add(evs ...kvEvent) {
	p.mu.Lock()
	p.cur = append(p.cur, evs...)
	if len(p.cur) >= maxBatchEvents {
		p.seal()
	}
	p.mu.Unlock()
}

// seal numbers the batch being filled, keeps it for replay and queues it for the sender, or
// counts it dropped when the queue is full. p.mu is held.
func (p *eventPublisher) seal() {
	b := &pubBatch{seq: p.next, ts: float64(time.Now().UnixNano()) / 1e9, events: p.cur}
	p.next++
	p.cur = nil
	if len(p.ring) < p.cfg.BufferSteps {
		p.ring = append(p.ring, b)
	} else {
		p.ring[p.head] = b
		p.head = (p.head + 1) % len(p.ring)
	}
	p.batches.Add(1)
	p.nevents.Add(int64(len(b.events)))
	select {
	case p.sendq <- b:
	default:
		p.dropped.Add(1)
	}
}

func (p *eventPublisher) flushLoop(ctx context.Context) {
	defer p.wg.Done()
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		p.mu.Lock()
		if len(p.cur) > 0 {
			p.seal()
		}
		p.mu.Unlock()
	}
}

func (p *eventPublisher) sendLoop(ctx context.Context) {
	defer p.wg.Done()
	for {
		var b *pubBatch
		select {
		case <-ctx.Done():
			return
		case b = <-p.sendq:
		}
		if skip := p.skip.Load(); skip != nil && (*skip)(b.seq) {
			p.dropped.Add(1)
			continue
		}
		payload := p.encoded(b)
		if err := p.pub.Send(zmq4.NewMsgFrom(p.topic, seqFrame(b.seq), payload)); err != nil {
			continue // no subscriber, or the socket closing: the batch stays in the replay buffer
		}
		p.bytes.Add(int64(len(payload)))
	}
}

// replayLoop answers replay requests (identity, "", start) with (identity, "", seq, payload) for
// every buffered batch numbered start or later, then (identity, "", -1, "").
func (p *eventPublisher) replayLoop() {
	defer p.wg.Done()
	for {
		msg, err := p.router.Recv()
		if err != nil {
			return
		}
		f := msg.Frames
		if len(f) != 3 || len(f[1]) != 0 || len(f[2]) != 8 {
			continue
		}
		id, start := f[0], int64(binary.BigEndian.Uint64(f[2]))
		p.replays.Add(1)
		for _, b := range p.buffered(start) {
			if p.router.Send(zmq4.NewMsgFrom(id, []byte{}, seqFrame(b.seq), p.encoded(b))) != nil {
				break
			}
		}
		_ = p.router.Send(zmq4.NewMsgFrom(id, []byte{}, seqFrame(-1), []byte{}))
	}
}

// buffered returns the buffered batches numbered start or later, in order.
func (p *eventPublisher) buffered(start int64) []*pubBatch {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*pubBatch
	for i := range p.ring {
		if b := p.ring[(p.head+i)%len(p.ring)]; b.seq >= start {
			out = append(out, b)
		}
	}
	return out
}

func seqFrame(seq int64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(seq))
	return b[:]
}

func (p *eventPublisher) encoded(b *pubBatch) []byte {
	b.once.Do(func() { b.payload = encodeBatch(b, p.cfg.Encoding == KVEncodingMap, p.blockSize) })
	return b.payload
}

// encodeBatch writes one EventBatch as vLLM's msgspec encoder does. The optional fields at their
// defaults (data_parallel_rank; extra_keys of base-model blocks) are left out, as msgspec's
// omit_defaults does. An adapter's blocks carry its name and id, and, per block, the extra hash
// keys vLLM folded in: the adapter's name.
func encodeBatch(b *pubBatch, maps bool, blockSize int) []byte {
	// The payload's size, about: the header, then per event its fields (their names too in a
	// map), 9 bytes a hash and 5 a token at most.
	size, perEvent := 32, 48
	if maps {
		perEvent = 160
	}
	for i := range b.events {
		size += perEvent + 9*len(b.events[i].hashes) + 5*len(b.events[i].tokens)
	}
	buf := bytes.NewBuffer(make([]byte, 0, size))
	enc := msgpack.GetEncoder()
	defer msgpack.PutEncoder(enc)
	enc.Reset(buf)
	if maps {
		_ = enc.EncodeMapLen(2)
		_ = enc.EncodeString("ts")
		_ = enc.EncodeFloat64(b.ts)
		_ = enc.EncodeString("events")
	} else {
		_ = enc.EncodeArrayLen(2)
		_ = enc.EncodeFloat64(b.ts)
	}
	_ = enc.EncodeArrayLen(len(b.events))
	for i := range b.events {
		encodeEvent(enc, &b.events[i], maps, blockSize)
	}
	return buf.Bytes()
}

func encodeEvent(enc *msgpack.Encoder, e *kvEvent, maps bool, blockSize int) {
	field := func(name string) {
		if maps {
			_ = enc.EncodeString(name)
		}
	}
	hashes := func() {
		_ = enc.EncodeArrayLen(len(e.hashes))
		for _, h := range e.hashes {
			_ = enc.EncodeUint64(h)
		}
	}
	// head starts an event of n fields (its type among them) whose type is typ: a map's length
	// and the "type" key, or an array's length.
	head := func(n int, typ string) {
		if maps {
			_ = enc.EncodeMapLen(n)
			_ = enc.EncodeString("type")
		} else {
			_ = enc.EncodeArrayLen(n)
		}
		_ = enc.EncodeString(typ)
	}
	switch e.kind {
	case kvcache.Stored:
		n := 8
		if e.lora.name != "" {
			n = 9 // and extra_keys
		}
		head(n, "BlockStored")
		field("block_hashes")
		hashes()
		field("parent_block_hash")
		if e.hasParent {
			_ = enc.EncodeUint64(e.parent)
		} else {
			_ = enc.EncodeNil()
		}
		field("token_ids")
		_ = enc.EncodeArrayLen(len(e.tokens))
		for _, t := range e.tokens {
			_ = enc.EncodeUint32(t)
		}
		field("block_size")
		_ = enc.EncodeInt(int64(blockSize))
		field("lora_id")
		if e.lora.id > 0 {
			_ = enc.EncodeInt(int64(e.lora.id))
		} else {
			_ = enc.EncodeNil()
		}
		field("medium")
		_ = enc.EncodeString("GPU")
		field("lora_name")
		if e.lora.name == "" {
			_ = enc.EncodeNil()
			break
		}
		_ = enc.EncodeString(e.lora.name)
		field("extra_keys")
		_ = enc.EncodeArrayLen(len(e.hashes))
		for range e.hashes {
			_ = enc.EncodeArrayLen(1)
			_ = enc.EncodeString(e.lora.name)
		}
	case kvcache.Evicted:
		head(3, "BlockRemoved")
		field("block_hashes")
		hashes()
		field("medium")
		_ = enc.EncodeString("GPU")
	case kvcache.Cleared:
		head(1, "AllBlocksCleared")
	}
}

// publishChanges turns the cache changes recorded by the last call into events. seq and hashes
// are the stream that call was about (nil for Reset), lora the adapter it ran with; eng.mu is
// held. Consecutive blocks stored
// together become one BlockStored chained to the block before the first, consecutive evictions
// one BlockRemoved.
func (w *Worker) publishChanges(seq *prompt.Sequence, hashes []uint64, lora adapter) {
	if w.events == nil {
		return
	}
	changes := w.eng.cache.TakeChanges()
	if len(changes) == 0 {
		return
	}
	bs := w.cfg.BlockSize
	evs := make([]kvEvent, 0, 2)
	for i := 0; i < len(changes); {
		c := changes[i]
		j := i + 1
		switch c.Kind {
		case kvcache.Cleared:
			evs = append(evs, kvEvent{kind: kvcache.Cleared})
		case kvcache.Evicted:
			for j < len(changes) && changes[j].Kind == kvcache.Evicted {
				j++
			}
			e := kvEvent{kind: kvcache.Evicted, hashes: make([]uint64, 0, j-i)}
			for _, c := range changes[i:j] {
				e.hashes = append(e.hashes, c.Hash)
			}
			evs = append(evs, e)
		case kvcache.Stored:
			for j < len(changes) && changes[j].Kind == kvcache.Stored && changes[j].Pos == changes[j-1].Pos+1 {
				j++
			}
			first, last := c.Pos, changes[j-1].Pos
			e := kvEvent{kind: kvcache.Stored, hashes: make([]uint64, 0, j-i), lora: lora}
			for _, c := range changes[i:j] {
				e.hashes = append(e.hashes, c.Hash)
			}
			if first > 0 {
				e.parent, e.hasParent = hashes[first-1], true
			}
			e.tokens = seq.AppendIDs(make([]uint32, 0, (last-first+1)*bs), first*bs, (last+1)*bs)
			evs = append(evs, e)
		}
		i = j
	}
	w.events.add(evs...)
}

// startEvents starts publishing when the worker's config asks for it, from an empty cache.
func (w *Worker) startEvents() error {
	if w.cfg.KVEvents.Endpoint == "" {
		return nil
	}
	p, err := startPublisher(w.cfg.KVEvents, w.cfg.BlockSize)
	if err != nil {
		return err
	}
	w.events = p
	w.eng.cache.Record(true)
	return nil
}

// stopEvents closes the publisher's sockets.
func (w *Worker) stopEvents() {
	if w.events != nil {
		w.events.close()
	}
}
