package bench

import (
	"sync"
	"time"
)

// loadSample is the in-flight count of every worker at one instant, whether the workload was in
// its steady state then (see Imbalance), and the working sets of the sessions in progress, in
// tokens (see Pressure).
type loadSample struct {
	loads   []float64
	steady  bool
	working int64
}

// maxSamples bounds a run's samples (about 2.7 hours at the default interval).
const maxSamples = 1 << 20

// sampler reads worker loads periodically until stopped.
type sampler struct {
	stopc   chan struct{}
	done    sync.WaitGroup
	samples []loadSample
}

// startSampler samples loads and working every interval (default 10ms); with a nil loads it does
// nothing.
func startSampler(loads func() []float64, steady func() bool, working func() int64, interval time.Duration) *sampler {
	s := &sampler{stopc: make(chan struct{})}
	if loads == nil {
		return s
	}
	if interval <= 0 {
		interval = 10 * time.Millisecond
	}
	s.done.Go(func() {
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for len(s.samples) < maxSamples {
			select {
			case <-s.stopc:
				return
			case <-tick.C:
				st := steady()
				if l := loads(); l != nil {
					s.samples = append(s.samples, loadSample{loads: l, steady: st, working: working()})
				}
			}
		}
	})
	return s
}

// stop ends sampling and returns the samples.
func (s *sampler) stop() []loadSample {
	close(s.stopc)
	s.done.Wait()
	return s.samples
}
