package discovery

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"
)

// recorder runs a source and keeps every set it reports.
type recorder struct {
	mu      sync.Mutex
	sets    [][]Endpoint
	changed chan struct{}
	done    chan error
}

func runSource(t *testing.T, src Source) *recorder {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	rec := &recorder{changed: make(chan struct{}, 1), done: make(chan error, 1)}
	go func() {
		rec.done <- src.Run(ctx, func(set []Endpoint) {
			rec.mu.Lock()
			rec.sets = append(rec.sets, set)
			rec.mu.Unlock()
			select {
			case rec.changed <- struct{}{}:
			default:
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-rec.done:
		case <-time.After(10 * time.Second):
			t.Error("source did not stop")
		}
	})
	return rec
}

// last is the latest set, and how many sets were reported.
func (r *recorder) last() ([]Endpoint, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.sets) == 0 {
		return nil, 0
	}
	return r.sets[len(r.sets)-1], len(r.sets)
}

// waitFor waits up to 10 s for a reported set that satisfies cond and returns it.
func (r *recorder) waitFor(t *testing.T, what string, cond func([]Endpoint) bool) []Endpoint {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		if set, n := r.last(); n > 0 && cond(set) {
			return set
		}
		select {
		case <-r.changed:
		case <-deadline:
			set, _ := r.last()
			t.Fatalf("timed out waiting for %s; last set %v", what, set)
		}
	}
}

// is returns a condition that holds for exactly the endpoints given as URL and readiness.
func is(want ...any) func([]Endpoint) bool {
	return func(set []Endpoint) bool {
		if len(set) != len(want)/2 {
			return false
		}
		for i, e := range set {
			if e.URL != want[2*i].(string) || e.Ready != want[2*i+1].(bool) {
				return false
			}
		}
		return true
	}
}

func (e Endpoint) String() string { return fmt.Sprintf("%s(ready=%v)", e.URL, e.Ready) }
