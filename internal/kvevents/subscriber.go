package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/go-zeromq/zmq4"
)

// subscriber.go reads one worker's event stream into the index: a ZMQ SUB socket dialled to the
// engine's PUB endpoint, each message three frames (topic, 8-byte big-endian sequence number,
// payload). Sequence numbers tell what was missed:
//   - the next number: applied;
//   - the last one again: a duplicate (vLLM promises at-least-once delivery), skipped;
//   - a jump ahead: batches were dropped. With a replay endpoint (the engine's ROUTER socket) the
//     missing ones are asked for, from the first missing number: the engine answers each stored
//     (sequence, payload) pair from that number on, or from its oldest when it no longer holds
//     that one, and then the end marker -1. Without one, or when the replay does not cover the
//     gap, the worker's index is forgotten: it would credit blocks the engine may have evicted in
//     the dropped batches; what the replay did bring, from its first batch on, is applied after.
//   - the first message heard, numbered N > 0 (the router started after the engine): 0..N-1 are
//     asked for the same way, and whatever run up to N-1 the engine still holds is applied.
//   - any other number behind: the publisher restarted (its count began again); its cache did too.
// A forgotten index fills again from the blocks stored afterwards, which is never more than the
// engine holds; Complete says whether it has every batch since the publisher's first.

// Source is one worker's event stream.
type Source struct {
	Worker   tenant.ID // the worker's key in the index
	Model    string    // the model it serves, the root of its blocks' keys
	Endpoint string    // its PUB socket, tcp://host:port
	Replay   string    // its replay ROUTER socket, or "" when it has none
	Topic    string    // the topic prefix to subscribe to; "" for every message
}

// Stats count what a subscriber saw; they only grow.
type Stats struct {
	Batches, Events, DecodeErrors, Duplicates, Gaps, Replays, Resyncs, Restarts atomic.Int64
	// Orphans counts stored blocks not indexed: their parent was never seen (stored before the
	// router listened, or forgotten since), or they came without their tokens.
	Orphans   atomic.Int64
	lastEvent atomic.Int64 // unix nanoseconds
}

// LastEvent is when the last batch arrived; zero before the first.
func (s *Stats) LastEvent() time.Time {
	if n := s.lastEvent.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Subscriber reads one Source into an Index.
type Subscriber struct {
	src   Source
	index *Index
	log   *slog.Logger
	dec   *Decoder
	Stats Stats

	drops    *PeerDrops // where its connections closed for breaking a bound are counted
	next     int64      // the sequence number expected next; -1 before the first
	pending  [][]byte   // a replay's run of payloads not applied yet
	complete atomic.Bool

	now func() time.Time
	// orphanedSince is when the batches began to store blocks of which none could be indexed
	// (zero while blocks are indexed), and orphanedLogged whether that run has been logged.
	orphanedSince  time.Time
	orphanedLogged bool
}

// NewSubscriber returns a subscriber of src into index; Run starts it.
func NewSubscriber(src Source, index *Index, log *slog.Logger) *Subscriber {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Subscriber{src: src, index: index, log: log.With("worker", src.Worker), dec: NewDecoder(), drops: new(PeerDrops), next: -1, now: time.Now}
}

// Complete reports whether the index holds every batch the publisher sent since its first: the
// subscriber saw sequence number 0 (or replayed from it) and every later one.
func (s *Subscriber) Complete() bool { return s.complete.Load() }

// replayTimeout bounds one replay; a replay that has not ended by then counts as failed.
const replayTimeout = 2 * time.Second

// redialDelay is the wait before dialling again after the stream broke.
const redialDelay = 500 * time.Millisecond

// Run reads the stream until ctx ends; it dials again whenever the connection breaks. It returns
// ctx's error.
func (s *Subscriber) Run(ctx context.Context) error {
	for {
		err := s.stream(ctx)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Warn("kv events: stream broke, dialling again", "endpoint", s.src.Endpoint, "error", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(redialDelay):
		}
	}
}

// stream reads one connection's messages until it breaks or ctx ends.
func (s *Subscriber) stream(ctx context.Context) error {
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sub := zmq4.NewSub(guarded(sctx, &guard{drops: s.drops}), zmq4.WithDialerRetry(redialDelay), zmq4.WithAutomaticReconnect(true))
	defer sub.Close()
	if err := sub.Dial(bounded(s.src.Endpoint)); err != nil {
		return err
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, s.src.Topic); err != nil {
		return err
	}
	for {
		msg, err := sub.Recv()
		if err != nil {
			return err
		}
		s.receive(ctx, msg.Frames)
	}
}

// receive handles one message.
func (s *Subscriber) receive(ctx context.Context, frames [][]byte) {
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.Stats.DecodeErrors.Add(1)
		return
	}
	seq := int64(binary.BigEndian.Uint64(frames[1]))
	switch {
	case s.next < 0: // the first message heard: what came before it is asked for too
		first := seq
		if seq > 0 && s.src.Replay != "" {
			first = s.replay(ctx, 0, seq)
		}
		s.complete.Store(first == 0)
	case seq == s.next:
	case seq == s.next-1:
		s.Stats.Duplicates.Add(1)
		return
	case seq > s.next:
		s.Stats.Gaps.Add(1)
		first := seq
		if s.src.Replay != "" {
			first = s.replay(ctx, s.next, seq)
		}
		if first > s.next {
			s.resync() // the batches s.next..first-1 are lost; the index is forgotten before the replayed ones apply
			s.applyAll(s.pending)
		}
	default: // behind: the publisher started counting again
		s.Stats.Restarts.Add(1)
		s.resync()
		s.complete.Store(seq == 0)
	}
	s.pending = nil
	s.apply(frames[2])
	s.next = seq + 1
}

// apply decodes and applies one payload.
func (s *Subscriber) apply(payload []byte) {
	b, err := s.dec.Decode(payload)
	if err != nil {
		s.Stats.DecodeErrors.Add(1)
		s.log.Debug("kv events: a batch that does not decode", "error", err)
		return
	}
	res := s.index.Apply(s.src.Worker, s.src.Model, b)
	now := s.now()
	s.Stats.Batches.Add(1)
	s.Stats.Events.Add(int64(len(b.Events)))
	s.Stats.Orphans.Add(int64(res.Orphans))
	s.Stats.lastEvent.Store(now.UnixNano())
	s.watchOrphans(res, now)
}

// orphanedLogAfter is how long a worker's batches may store blocks of which none is indexed
// before it is logged.
const orphanedLogAfter = time.Minute

// watchOrphans logs, once, a worker whose batches have stored blocks for orphanedLogAfter without
// one of them indexed: its events index nothing while every other count looks healthy. A block
// indexed again ends the run, and a later run is logged again.
func (s *Subscriber) watchOrphans(res ApplyResult, now time.Time) {
	switch {
	case res.Stored > 0:
		s.orphanedSince, s.orphanedLogged = time.Time{}, false
	case res.Orphans == 0:
	case s.orphanedSince.IsZero():
		s.orphanedSince = now
	case !s.orphanedLogged && now.Sub(s.orphanedSince) >= orphanedLogAfter:
		s.orphanedLogged = true
		s.log.Warn("kv events: the worker's batches have stored blocks and indexed none for a minute: each stored block's parent is one the router never saw, or the blocks came without their tokens",
			"since", s.orphanedSince, "orphaned_blocks", s.Stats.Orphans.Load())
	}
}

// resync forgets the worker's index: batches it depends on were lost.
func (s *Subscriber) resync() {
	s.Stats.Resyncs.Add(1)
	s.complete.Store(false)
	s.index.Forget(s.src.Worker)
}

var errReplayShort = errors.New("the replay ended before the gap was filled")

// replay asks the replay endpoint for the batches from..upto-1 and returns the number of the first
// one it got: they are the run first..upto-1, which the engine's answer holds whole and in order.
// An engine answers from the oldest batch it still keeps when it no longer has from (its buffer
// holds the last buffer_steps), so first may be past from; on failure it is upto, nothing. When
// first is from the run is applied here; otherwise it is left in s.pending for the caller, who
// must first forget what the lost batches may have changed.
func (s *Subscriber) replay(ctx context.Context, from, upto int64) int64 {
	s.Stats.Replays.Add(1)
	first, err := s.fetch(ctx, from, upto)
	if err != nil {
		s.log.Warn("kv events: replay failed", "endpoint", s.src.Replay, "from", from, "upto", upto, "error", err)
		s.pending = nil
		return upto
	}
	if first > from {
		s.log.Info("kv events: the replay began after the batch asked for", "endpoint", s.src.Replay, "from", from, "first", first)
	}
	if first == from || s.next < 0 { // nothing lost, or nothing indexed that the lost ones changed
		s.applyAll(s.pending)
		s.pending = nil
	}
	return first
}

// applyAll applies payloads in order.
func (s *Subscriber) applyAll(payloads [][]byte) {
	for _, p := range payloads {
		s.apply(p)
	}
}

// fetch collects into s.pending the replay's answers for from..upto-1, the last run of consecutive
// numbers that ends at upto-1 (its newest within maxReplayBytes), and returns the run's first
// number. Answers before from (the engine kept more) or from upto on (the stream brings them) are
// passed over. Nothing is applied here, so that a replay that breaks off or times out leaves the
// index as it was; the run holds at most upto-from payloads.
func (s *Subscriber) fetch(ctx context.Context, from, upto int64) (int64, error) {
	rctx, cancel := context.WithTimeout(ctx, replayTimeout)
	defer cancel()
	d := zmq4.NewDealer(guarded(rctx, &guard{drops: s.drops}), zmq4.WithDialerTimeout(replayTimeout))
	defer d.Close()
	if err := d.Dial(bounded(s.src.Replay)); err != nil {
		return upto, err
	}
	var start [8]byte
	binary.BigEndian.PutUint64(start[:], uint64(from))
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, start[:])); err != nil {
		return upto, err
	}
	s.pending = nil
	run := replayRun{first: from, next: from}
	for {
		msg, err := d.Recv()
		if err != nil {
			return upto, err
		}
		frames := msg.Frames
		if len(frames) == 3 && len(frames[0]) == 0 {
			frames = frames[1:] // the empty delimiter the ROUTER sent back
		}
		if len(frames) != 2 || len(frames[0]) != 8 {
			return upto, fmt.Errorf("a replay answer of %d frames", len(msg.Frames))
		}
		seq := int64(binary.BigEndian.Uint64(frames[0]))
		switch {
		case seq == -1:
			if run.next < upto {
				return upto, errReplayShort
			}
			s.pending = run.payloads
			return run.first, nil
		case seq < run.next || seq >= upto:
			continue
		}
		run.add(seq, frames[1])
	}
}

// maxReplayBytes bounds the payloads one replay holds before they are applied: an engine keeps its
// last 10,000 batches (vLLM's buffer_steps), and a replay endpoint could send for all of its 2 s.
const maxReplayBytes = 4 * MaxMessageBytes

// replayRun is the last run of consecutive batches a replay brought, first..next-1: its newest
// within maxReplayBytes.
type replayRun struct {
	first, next int64
	payloads    [][]byte
	bytes       int
}

// add takes batch seq: the next of the run or, past a hole (the engine no longer holds the batches
// between), the first of a new run. While the run is over its bound its oldest batches are let go,
// and it starts later, as it does when the engine no longer holds them.
func (r *replayRun) add(seq int64, payload []byte) {
	if seq != r.next {
		clear(r.payloads)
		r.payloads, r.bytes, r.first = nil, 0, seq
	}
	r.payloads = append(r.payloads, payload)
	r.bytes += len(payload)
	r.next = seq + 1
	for r.bytes > maxReplayBytes {
		r.bytes -= len(r.payloads[0])
		r.payloads[0] = nil
		r.payloads = r.payloads[1:]
		r.first++
	}
}
