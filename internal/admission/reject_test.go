package admission_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// rejection returns err as a *Rejection, failing the test when it is not one.
func rejection(t *testing.T, err error) *admission.Rejection {
	t.Helper()
	var rej *admission.Rejection
	if !errors.As(err, &rej) {
		t.Fatalf("error %v, want a *Rejection", err)
	}
	return rej
}

// arriveAtFullQueue sends request id with tk to c, whose queue is full, and fails unless the first
// request to return is the one named refused, turned away with queue_full: the arrival itself, or
// the waiting request it displaced. It returns that refusal.
func arriveAtFullQueue(t *testing.T, c *admission.Controller, id string, tk admission.Ticket, out chan outcome, refused string) *admission.Rejection {
	t.Helper()
	admitAsync(t.Context(), c, id, tk, out)
	o := receive(t, out)
	if o.id != refused {
		t.Fatalf("%s returned first (%v), want %s refused", o.id, o.err, refused)
	}
	rej := rejection(t, o.err)
	if rej.Reason != admission.QueueFull {
		t.Fatalf("%s refused with %+v, want queue_full", o.id, rej)
	}
	return rej
}

func TestAdmit_FullQueueRejectsAtOnce(t *testing.T) {
	rec := newRecorder()
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 1, RetryAfter: 3 * time.Second, Reporter: rec})
	hold := mustAdmit(t, c, admission.Ticket{Tenant: "a"})
	out := make(chan outcome, 2)
	enqueue(t, c, "queued", admission.Ticket{Tenant: "a"}, out)

	// No QueueTimeout and a context that never ends: only an immediate answer returns.
	rej := arriveAtFullQueue(t, c, "over", admission.Ticket{Tenant: "a"}, out, "over")
	if rej.RetryAfter != 3*time.Second {
		t.Fatalf("rejection %+v, want Retry-After 3s", rej)
	}
	if n := rec.rejections(admission.DefaultLevel, admission.QueueFull); n != 1 {
		t.Fatalf("reported %d queue_full rejections, want 1", n)
	}
	hold.Release()
	receive(t, out).permit.Release()
}

func TestAdmit_NoQueueRejectsWhatCannotStart(t *testing.T) {
	c := newController(t, admission.Options{MaxInFlight: 1})
	hold := mustAdmit(t, c, admission.Ticket{})
	_, err := admitBounded(t, c, admission.Ticket{})
	if rejection(t, err).Reason != admission.QueueFull {
		t.Fatalf("error %v, want queue_full", err)
	}
	hold.Release()
}

func TestAdmit_FullQueueDisplacesTheNewestLowerPriorityRequest(t *testing.T) {
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 2, Priorities: threeLevels})
	batch := admission.Ticket{Tenant: "b", Priority: "batch"}
	hold, out := occupy(t, c, waiter{"batch-old", batch}, waiter{"batch-new", batch})

	arriveAtFullQueue(t, c, "interactive", admission.Ticket{Tenant: "u", Priority: "interactive"}, out, "batch-new")
	if c.Queued() != 2 {
		t.Fatalf("queued %d, want 2", c.Queued())
	}
	hold.Release()
	if got := drainOrder(t, 2, out); got[0] != "interactive" || got[1] != "batch-old" {
		t.Fatalf("admission order %v, want [interactive batch-old]", got)
	}
}

func TestAdmit_FullQueueDisplacesTheFloodingTenantOnly(t *testing.T) {
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 4})
	a := admission.Ticket{Tenant: "a"}
	hold, out := occupy(t, c, waiter{"a0", a}, waiter{"a1", a}, waiter{"a2", a}, waiter{"c0", admission.Ticket{Tenant: "c"}})

	// b has none waiting, a has three: a's newest makes room, not c's only request.
	arriveAtFullQueue(t, c, "b0", admission.Ticket{Tenant: "b"}, out, "a2")
	// Now a has two and b one: displacing would only swap their shares, so b is refused.
	testkit.WaitFor(t, "b0 queued", func() bool { return c.Queued() == 4 })
	_, err := admitBounded(t, c, admission.Ticket{Tenant: "b"})
	if rejection(t, err).Reason != admission.QueueFull {
		t.Fatalf("second b request: %v, want queue_full", err)
	}
	hold.Release()
	drainOrder(t, 4, out)
}

func TestAdmit_FullQueueRefusesALowerPriorityArrival(t *testing.T) {
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 2, Priorities: threeLevels})
	interactive := admission.Ticket{Tenant: "a", Priority: "interactive"}
	hold, out := occupy(t, c, waiter{"i0", interactive}, waiter{"i1", interactive})

	// The batch arrival's tenant has nothing waiting, but everything waiting outranks it.
	_, err := admitBounded(t, c, admission.Ticket{Tenant: "b", Priority: "batch"})
	if rejection(t, err).Reason != admission.QueueFull {
		t.Fatalf("batch arrival at a queue full of interactive requests: %v, want queue_full", err)
	}
	hold.Release()
	if got := drainOrder(t, 2, out); !slices.Equal(got, []string{"i0", "i1"}) {
		t.Fatalf("admitted %v, want both interactive requests", got)
	}
}

func TestAdmit_WaitingPastQueueTimeoutRejects(t *testing.T) {
	rec := newRecorder()
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 1, QueueTimeout: 20 * time.Millisecond, Reporter: rec})
	hold := mustAdmit(t, c, admission.Ticket{})
	_, err := admitBounded(t, c, admission.Ticket{Tenant: "a"})
	rej := rejection(t, err)
	if rej.Reason != admission.QueueTimeout || rej.RetryAfter <= 0 {
		t.Fatalf("rejection %+v, want queue_timeout with a Retry-After", rej)
	}
	if c.Queued() != 0 || c.TenantsWaiting() != 0 {
		t.Fatalf("queued %d, tenants %d after the timeout; want 0", c.Queued(), c.TenantsWaiting())
	}
	if n := rec.rejections(admission.DefaultLevel, admission.QueueTimeout); n != 1 {
		t.Fatalf("reported %d queue_timeout rejections, want 1", n)
	}
	hold.Release()
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d, want 0: the timed-out request must not be admitted later", c.InFlight())
	}
}

func TestAdmit_CancelledClientLeavesTheQueueAtOnce(t *testing.T) {
	rec := newRecorder()
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 4, Reporter: rec})
	hold := mustAdmit(t, c, admission.Ticket{})
	ctx, cancel := context.WithCancel(t.Context())
	out := make(chan outcome, 1)
	admitAsync(ctx, c, "gone", admission.Ticket{Tenant: "a"}, out)
	testkit.WaitFor(t, "queued", func() bool { return c.Queued() == 1 })
	cancel()

	o := receive(t, out)
	if rejection(t, o.err).Reason != admission.ClientGone || !errors.Is(o.err, context.Canceled) {
		t.Fatalf("error %v, want client_gone wrapping context.Canceled", o.err)
	}
	if c.Queued() != 0 || c.TenantsWaiting() != 0 {
		t.Fatalf("queued %d, tenants %d after the client left; want 0", c.Queued(), c.TenantsWaiting())
	}
	if rec.length(admission.DefaultLevel) != 0 || rec.rejections(admission.DefaultLevel, admission.ClientGone) != 1 {
		t.Fatalf("reported length %d and %d client_gone; want 0 and 1",
			rec.length(admission.DefaultLevel), rec.rejections(admission.DefaultLevel, admission.ClientGone))
	}
	hold.Release()
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d, want 0: the cancelled request must not be admitted later", c.InFlight())
	}
}

func TestAdmit_EndedContextIsRefusedWithoutQueueing(t *testing.T) {
	c := newController(t, admission.Options{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := c.Admit(ctx, admission.Ticket{})
	if rejection(t, err).Reason != admission.ClientGone || rejection(t, err).RetryAfter != 0 {
		t.Fatalf("error %v, want client_gone without Retry-After", err)
	}
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d, want 0", c.InFlight())
	}
}
