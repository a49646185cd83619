package admission_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/admission"
)

func TestNew_RefusesInvalidOptions(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts admission.Options
	}{
		{"negative limit", admission.Options{MaxInFlight: -1}},
		{"negative queue", admission.Options{QueueSize: -1}},
		{"negative timeout", admission.Options{QueueTimeout: -time.Second}},
		{"empty level name", admission.Options{Priorities: []string{"high", ""}}},
		{"level named twice", admission.Options{Priorities: []string{"high", "low", "high"}}},
		{"unknown default", admission.Options{Priorities: []string{"high", "low"}, DefaultPriority: "mid"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := admission.New(tc.opts); err == nil {
				t.Fatal("New accepted invalid options")
			}
		})
	}
}

func TestAdmit_StartsAtOnceUpToTheLimit(t *testing.T) {
	rec := newRecorder()
	c := newController(t, admission.Options{MaxInFlight: 3, Reporter: rec})
	var permits []*admission.Permit
	for range 3 {
		permits = append(permits, mustAdmit(t, c, admission.Ticket{Tenant: "a"}))
	}
	if c.InFlight() != 3 || c.Queued() != 0 {
		t.Fatalf("in flight %d, queued %d; want 3 and 0", c.InFlight(), c.Queued())
	}
	for _, p := range permits {
		if p.Waited() != 0 {
			t.Fatalf("a request under the limit waited %v", p.Waited())
		}
		p.Release()
	}
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d after every release, want 0", c.InFlight())
	}
	if w := rec.waited(admission.DefaultLevel); len(w) != 3 {
		t.Fatalf("observed %d waits, want one per admitted request", len(w))
	}
}

func TestAdmit_WithoutLimitsNeverQueues(t *testing.T) {
	c := newController(t, admission.Options{})
	var permits []*admission.Permit
	for range 100 {
		permits = append(permits, mustAdmit(t, c, admission.Ticket{}))
	}
	if c.InFlight() != 100 {
		t.Fatalf("in flight %d, want 100", c.InFlight())
	}
	for _, p := range permits {
		p.Release()
	}
}

func TestPermit_ReleaseCountsOnce(t *testing.T) {
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 2})
	hold, out := occupy(t, c, waiter{"first", admission.Ticket{}}, waiter{"second", admission.Ticket{}})

	hold.Release()
	hold.Release() // must not free a second place
	first := receive(t, out)
	if first.id != "first" {
		t.Fatalf("admitted %s, want first", first.id)
	}
	if c.InFlight() != 1 || c.Queued() != 1 {
		t.Fatalf("in flight %d, queued %d after a double release; want 1 and 1", c.InFlight(), c.Queued())
	}
	first.permit.Release()
	receive(t, out).permit.Release()
	first.permit.Release()
	if c.InFlight() != 0 || c.Queued() != 0 {
		t.Fatalf("in flight %d, queued %d at the end; want 0 and 0", c.InFlight(), c.Queued())
	}
}

func TestAdmit_ReportsWaitsAndQueueLengthsByPriority(t *testing.T) {
	rec := newRecorder()
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 4, Priorities: threeLevels, Reporter: rec})
	hold := mustAdmit(t, c, admission.Ticket{Priority: "interactive"})
	out := make(chan outcome, 2)
	enqueue(t, c, "b", admission.Ticket{Priority: "batch"}, out)
	enqueue(t, c, "i", admission.Ticket{Priority: "interactive"}, out)
	if rec.length("batch") != 1 || rec.length("interactive") != 1 || rec.length("default") != 0 {
		t.Fatalf("queue lengths %v, want batch 1, interactive 1", rec.lengths)
	}
	time.Sleep(2 * time.Millisecond) // so that the queued requests' waits are measurably positive
	hold.Release()
	drainOrder(t, 2, out)
	if rec.length("batch") != 0 || rec.length("interactive") != 0 {
		t.Fatalf("queue lengths %v after the drain, want 0", rec.lengths)
	}
	wi, wb := rec.waited("interactive"), rec.waited("batch")
	if len(wi) != 2 || wi[0] != 0 || wi[1] <= 0 || len(wb) != 1 || wb[0] <= 0 {
		t.Fatalf("waits interactive %v, batch %v; want [0 >0] and [>0]", wi, wb)
	}
}

// readiness is a Ready hook whose answer per model the test sets.
type readiness struct {
	mu    sync.Mutex
	ready map[string]bool
	asked atomic.Int64
}

func (r *readiness) set(model string, ok bool) {
	r.mu.Lock()
	r.ready[model] = ok
	r.mu.Unlock()
}

func (r *readiness) Ready(model string, _ int) bool {
	r.asked.Add(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ready[model]
}

func TestAdmit_ReadyHoldsOnlyTheRequestsOfBusyModels(t *testing.T) {
	r := &readiness{ready: map[string]bool{"small": true}}
	c := newController(t, admission.Options{QueueSize: 10, Ready: r.Ready})
	out := make(chan outcome, 2)
	enqueue(t, c, "big", admission.Ticket{Model: "big"}, out)

	// A model with room starts at once, though an earlier request of a busy one waits.
	p := mustAdmit(t, c, admission.Ticket{Model: "small"})
	if c.Queued() != 1 {
		t.Fatalf("queued %d, want the big-model request still waiting", c.Queued())
	}

	// Room appearing is noticed on Wake...
	r.set("big", true)
	c.Wake()
	receive(t, out).permit.Release()

	// ...and on a release.
	r.set("big", false)
	enqueue(t, c, "big2", admission.Ticket{Model: "big"}, out)
	r.set("big", true)
	p.Release()
	receive(t, out).permit.Release()
	if c.InFlight() != 0 || c.Queued() != 0 {
		t.Fatalf("in flight %d, queued %d; want 0", c.InFlight(), c.Queued())
	}
}

func TestAdmit_ReadyIsAskedOncePerBusyModelPerPass(t *testing.T) {
	r := &readiness{ready: map[string]bool{}}
	c := newController(t, admission.Options{QueueSize: 100, Ready: r.Ready})
	out := make(chan outcome, 100)
	for i := range 50 {
		enqueue(t, c, fmt.Sprint(i), admission.Ticket{Tenant: fmt.Sprint(i % 5), Model: "busy"}, out)
	}
	r.asked.Store(0)
	c.Wake()
	if n := r.asked.Load(); n != 1 {
		t.Fatalf("Ready asked %d times for 50 requests of one busy model, want 1", n)
	}
	r.set("busy", true)
	c.Wake()
	for range 50 {
		receive(t, out).permit.Release()
	}
}

func TestAdmit_ReadyCountsRequestsAdmittedButNotYetAtTheirWorker(t *testing.T) {
	// Room for two requests of the model, whatever the workers' loads say: the requests
	// admitted in one pass over the queue have not reached a worker yet.
	c := newController(t, admission.Options{QueueSize: 10,
		Ready: func(_ string, admitted int) bool { return admitted < 2 }})
	first, second := mustAdmit(t, c, admission.Ticket{Model: "m"}), mustAdmit(t, c, admission.Ticket{Model: "m"})
	out := make(chan outcome, 10)
	for i := range 5 {
		enqueue(t, c, fmt.Sprint(i), admission.Ticket{Model: "m"}, out)
	}
	if c.InFlight() != 2 || c.Queued() != 5 {
		t.Fatalf("in flight %d, queued %d; want 2 and 5", c.InFlight(), c.Queued())
	}
	first.Release()
	third := receive(t, out).permit
	c.Wake()
	if c.InFlight() != 2 || c.Queued() != 4 {
		t.Fatalf("after one release: in flight %d, queued %d; want exactly one more admitted (2 and 4)", c.InFlight(), c.Queued())
	}
	second.Release()
	third.Release()
	for range 4 {
		receive(t, out).permit.Release()
	}
	if c.InFlight() != 0 || c.Queued() != 0 {
		t.Fatalf("in flight %d, queued %d; want 0", c.InFlight(), c.Queued())
	}
}

// TestAdmit_StressKeepsTheLimitAndLeavesNothingBehind runs admissions, timeouts, cancellations
// and racing double releases together; run it with -race.
func TestAdmit_StressKeepsTheLimitAndLeavesNothingBehind(t *testing.T) {
	const limit = 4
	c := newController(t, admission.Options{
		MaxInFlight: limit, QueueSize: 16, QueueTimeout: 2 * time.Millisecond, Priorities: threeLevels,
	})
	var running, peak atomic.Int64
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	for g := range 32 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 1))
			for range 200 {
				ctx, cancel := context.WithCancel(context.Background())
				if rng.IntN(8) == 0 {
					go cancel()
				}
				tk := admission.Ticket{Tenant: fmt.Sprint(rng.IntN(6)), Priority: threeLevels[rng.IntN(3)]}
				p, err := c.Admit(ctx, tk)
				if err != nil {
					refused.Add(1)
					cancel()
					continue
				}
				admitted.Add(1)
				n := running.Add(1)
				for {
					m := peak.Load()
					if n <= m || peak.CompareAndSwap(m, n) {
						break
					}
				}
				if rng.IntN(4) == 0 {
					time.Sleep(time.Duration(rng.IntN(200)) * time.Microsecond)
				}
				running.Add(-1)
				var both sync.WaitGroup
				both.Go(p.Release)
				both.Go(p.Release)
				both.Wait()
				cancel()
			}
		})
	}
	wg.Wait()
	if peak.Load() > limit {
		t.Fatalf("%d requests ran at once, limit %d", peak.Load(), limit)
	}
	if c.InFlight() != 0 || c.Queued() != 0 || c.TenantsWaiting() != 0 {
		t.Fatalf("in flight %d, queued %d, tenants %d at the end; want 0", c.InFlight(), c.Queued(), c.TenantsWaiting())
	}
	if admitted.Load() == 0 || refused.Load() == 0 {
		t.Fatalf("admitted %d, refused %d: the stress did not exercise both paths", admitted.Load(), refused.Load())
	}
	t.Logf("admitted %d, refused %d, peak %d", admitted.Load(), refused.Load(), peak.Load())
}

func TestReserveKeepsPlacesForTheHighestPriority(t *testing.T) {
	c := newController(t, admission.Options{MaxInFlight: 3, Reserve: 1, QueueSize: 10, Priorities: threeLevels})
	low := threeLevels[len(threeLevels)-1]
	a, b := mustAdmit(t, c, admission.Ticket{Priority: low}), mustAdmit(t, c, admission.Ticket{Priority: low})
	out := make(chan outcome, 4)
	enqueue(t, c, "third-low", admission.Ticket{Priority: low}, out)
	// The last place is the top level's: it starts at once while a lower request waits.
	top := mustAdmit(t, c, admission.Ticket{Priority: threeLevels[0]})
	if c.InFlight() != 3 || c.Queued() != 1 {
		t.Fatalf("in flight %d, queued %d; want 3 and the low request waiting", c.InFlight(), c.Queued())
	}
	top.Release()
	if c.Queued() != 1 {
		t.Fatal("a lower request took the reserved place")
	}
	a.Release()
	receive(t, out).permit.Release()
	b.Release()
	if c.InFlight() != 0 || c.Queued() != 0 {
		t.Fatalf("in flight %d, queued %d; want 0", c.InFlight(), c.Queued())
	}
	if _, err := admission.New(admission.Options{MaxInFlight: 2, Reserve: 2}); err == nil {
		t.Fatal("a reserve of every place was accepted")
	}
}
