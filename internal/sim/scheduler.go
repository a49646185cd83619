package sim

import (
	"context"
	"errors"
	"slices"
	"time"

	"github.com/cacheroute/cacheroute/internal/sim/kvcache"
	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

// scheduler.go schedules the requests of one engine as vLLM's scheduler does with its default
// first-come-first-served policy, over the engine's KV cache:
//
//   - A request waits in a FIFO queue until it is admitted to running. The head of the queue is
//     admitted when fewer than MaxNumSeqs requests run and the cache can give it every block of
//     its prompt that is not cached already (free blocks, or cached ones no running request
//     holds, evicted least recently used first): its prompt's cached blocks are its prefix-cache
//     hit. While the head does not fit, nothing behind it is admitted.
//   - A running request holds a block for every BlockSize tokens of its prompt and of what it
//     generated so far. When its next token needs a block and none is free or evictable, the
//     most recently admitted running request is preempted (it may be the request itself): its
//     blocks are released (its computed prompt blocks stay cached until evicted), it goes back to
//     the front of the queue, and once admitted again it computes its prompt and the tokens it had
//     generated again (vLLM's recompute preemption), then goes on generating. Preemptions are
//     counted in vllm:num_preemptions_total.
//
// Everything here runs under the engine's mutex, beside the cache it allocates from.

// errPreempted ends the sleeps of a running request that another one preempted.
var errPreempted = errors.New("sim: request preempted")

// scheduler is the engine's running and waiting requests, guarded by engine.mu.
type scheduler struct {
	max     int         // MaxNumSeqs
	running []*sequence // in admission order: the last one is preempted first
	waiting []*sequence // in arrival order; preempted requests go to the front
}

// seqState is where a sequence is.
type seqState uint8

const (
	seqNew     seqState = iota // not queued yet
	seqWaiting                 // in the waiting queue
	seqRunning                 // admitted: holds its blocks
	seqDone                    // ended
)

// sequence is one generation request as the scheduler sees it. Its fields are guarded by
// engine.mu, but ctx, hashes and maxHit, which are set before it is queued and never change.
type sequence struct {
	ctx    context.Context // the request's context
	hashes []uint64        // the prompt's full-block hashes
	maxHit int             // the prompt blocks a look-up may hit: (prompt tokens - 1) / BlockSize
	// tokens are the tokens whose KV the request holds while it runs: the prompt, then also what
	// it generated. A readmitted request computes them all again.
	tokens int
	state  seqState
	pin    kvcache.Pin
	hit    int           // prompt blocks the last admission found computed
	ready  chan struct{} // closed when admitted
	// run is the context of the current admission's sleeps: preemption cancels it with
	// errPreempted.
	run         context.Context
	stop        context.CancelCauseFunc
	preemptions int
	// preemptedAt is when the last preemption took s's blocks: the time it lost is counted from
	// then, not from when its goroutine next ran.
	preemptedAt time.Time
}

func newScheduler(max int) scheduler { return scheduler{max: max} }

// blocksFor is the number of blocks that hold tokens tokens.
func (w *Worker) blocksFor(tokens int) int { return (tokens + w.cfg.BlockSize - 1) / w.cfg.BlockSize }

// enqueue puts s at the back of the waiting queue and admits what fits. It reports whether s
// was admitted at once.
func (w *Worker) enqueue(s *sequence) bool {
	w.eng.mu.Lock()
	defer w.eng.mu.Unlock()
	s.state, s.ready = seqWaiting, make(chan struct{})
	w.sched.waiting = append(w.sched.waiting, s)
	w.scheduleLocked()
	return s.state == seqRunning
}

// awaitAdmission waits until s runs, or s.ctx ends; then s leaves the queue and the error is
// the context's. A request admitted as its context ended counts as admitted: it ends at its
// first sleep.
func (w *Worker) awaitAdmission(s *sequence) error {
	w.eng.mu.Lock()
	ready := s.ready
	w.eng.mu.Unlock()
	select {
	case <-ready:
		return nil
	case <-s.ctx.Done():
	}
	w.eng.mu.Lock()
	defer w.eng.mu.Unlock()
	if s.state == seqRunning {
		return nil
	}
	w.endLocked(s)
	return s.ctx.Err()
}

// scheduleLocked admits waiting requests from the head of the queue while they fit.
func (w *Worker) scheduleLocked() {
	sc := &w.sched
	for len(sc.waiting) > 0 && len(sc.running) < sc.max {
		s := sc.waiting[0]
		extra := w.blocksFor(s.tokens) - len(s.hashes)
		if !w.eng.cache.Fits(s.hashes, extra) {
			break
		}
		sc.waiting[0] = nil
		sc.waiting = sc.waiting[1:]
		s.hit, s.pin = w.eng.cache.Acquire(s.hashes, s.maxHit)
		for range extra {
			w.eng.cache.Grow(&s.pin) // cannot fail: Fits counted these blocks
		}
		s.state = seqRunning
		s.run, s.stop = context.WithCancelCause(s.ctx)
		sc.running = append(sc.running, s)
		close(s.ready)
	}
	w.publishChanges(nil, nil, adapter{}) // evictions only
}

// reserve records that s now holds the KV of tokens tokens and gives it the blocks they need,
// preempting the most recently admitted running requests while none is free. It reports false
// when s is not running: it was preempted, now or before.
func (w *Worker) reserve(s *sequence, tokens int) bool {
	w.eng.mu.Lock()
	defer w.eng.mu.Unlock()
	defer w.publishChanges(nil, nil, adapter{})
	if s.state != seqRunning {
		return false
	}
	s.tokens = tokens
	for s.pin.Len() < w.blocksFor(tokens) {
		if w.eng.cache.Grow(&s.pin) {
			continue
		}
		victim := w.sched.running[len(w.sched.running)-1]
		w.preemptLocked(victim)
		if victim == s {
			return false
		}
	}
	return true
}

// preemptLocked releases the blocks of running request s and puts it at the front of the queue.
func (w *Worker) preemptLocked(s *sequence) {
	sc := &w.sched
	sc.running = slices.DeleteFunc(sc.running, func(r *sequence) bool { return r == s })
	w.eng.cache.Release(&s.pin)
	s.state, s.ready = seqWaiting, make(chan struct{})
	sc.waiting = slices.Insert(sc.waiting, 0, s)
	s.preemptions++
	s.preemptedAt = w.clock.Now()
	w.eng.stats.Preemptions++
	w.metrics.preemptions.Inc()
	s.stop(errPreempted)
}

// running reports whether s still runs, and with its blocks: for its owner, between sleeps.
func (w *Worker) running(s *sequence) bool {
	w.eng.mu.Lock()
	defer w.eng.mu.Unlock()
	return s.state == seqRunning
}

// end takes s out of the scheduler: a running request's blocks are released, a waiting one
// leaves the queue. Then what fits is admitted.
func (w *Worker) end(s *sequence) {
	w.eng.mu.Lock()
	defer w.eng.mu.Unlock()
	w.endLocked(s)
}

// commit ends s, which finished, caching its blocks: seq is the whole stream it leaves behind
// (prompt and reply) and hashes its full-block hashes. It reports false, and only ends s, when s
// was preempted after its last token: its blocks are gone.
func (w *Worker) commit(s *sequence, seq *prompt.Sequence, hashes []uint64, lora adapter) bool {
	w.eng.mu.Lock()
	defer w.eng.mu.Unlock()
	if s.state != seqRunning {
		w.endLocked(s)
		return false
	}
	w.sched.running = slices.DeleteFunc(w.sched.running, func(r *sequence) bool { return r == s })
	w.eng.cache.Commit(&s.pin, hashes)
	w.publishChanges(seq, hashes, lora)
	s.stop(context.Canceled)
	s.state = seqDone
	w.scheduleLocked()
	return true
}

func (w *Worker) endLocked(s *sequence) {
	sc := &w.sched
	switch s.state {
	case seqRunning:
		sc.running = slices.DeleteFunc(sc.running, func(r *sequence) bool { return r == s })
		w.eng.cache.Release(&s.pin)
		s.stop(context.Canceled)
	case seqWaiting:
		sc.waiting = slices.DeleteFunc(sc.waiting, func(r *sequence) bool { return r == s })
	}
	s.state = seqDone
	w.scheduleLocked()
}

// load returns the number of running and waiting requests.
func (w *Worker) load() (running, waiting int) {
	w.eng.mu.Lock()
	defer w.eng.mu.Unlock()
	return len(w.sched.running), len(w.sched.waiting)
}
