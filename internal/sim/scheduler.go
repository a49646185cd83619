package sim

import (
	"context"
	"sync"
)

// scheduler admits at most max requests at once and queues the rest in
// arrival order, as vLLM's scheduler does with --max-num-seqs. A waiting
// request whose client leaves is removed from the queue; a running one gives
// its slot to the head of the queue when it ends.
type scheduler struct {
	mu      sync.Mutex
	max     int
	running int
	queue   []*ticket
}

type ticket struct {
	ready   chan struct{}
	granted bool
}

func newScheduler(max int) *scheduler { return &scheduler{max: max} }

// acquire returns once the caller holds a running slot, with queued set when
// it had to wait, or with ctx's error if ctx ends first.
func (s *scheduler) acquire(ctx context.Context) (queued bool, err error) {
	s.mu.Lock()
	if s.running < s.max && len(s.queue) == 0 {
		s.running++
		s.mu.Unlock()
		return false, nil
	}
	t := &ticket{ready: make(chan struct{})}
	s.queue = append(s.queue, t)
	s.mu.Unlock()

	select {
	case <-t.ready:
		return true, nil
	case <-ctx.Done():
	}
	s.mu.Lock()
	if t.granted {
		// The slot arrived together with the cancellation: pass it on.
		s.mu.Unlock()
		s.release()
		return true, ctx.Err()
	}
	for i, q := range s.queue {
		if q == t {
			s.queue = append(s.queue[:i], s.queue[i+1:]...)
			break
		}
	}
	s.mu.Unlock()
	return true, ctx.Err()
}

// release gives the caller's slot to the oldest waiting request, or frees it.
func (s *scheduler) release() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.queue) > 0 {
		t := s.queue[0]
		s.queue[0] = nil
		s.queue = s.queue[1:]
		t.granted = true
		close(t.ready)
		return
	}
	s.running--
}

// load returns the number of running and waiting requests.
func (s *scheduler) load() (running, waiting int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.running, len(s.queue)
}
