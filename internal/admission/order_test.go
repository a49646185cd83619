package admission_test

import (
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

var threeLevels = []string{"interactive", "default", "batch"}

func TestAdmit_HigherPriorityLeavesTheQueueFirst(t *testing.T) {
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 10, Priorities: threeLevels})
	hold := mustAdmit(t, c, admission.Ticket{Tenant: "a"})
	out := make(chan outcome, 10)
	// Queued lowest first, so arrival order alone would give the reverse of the wanted order.
	enqueue(t, c, "batch", admission.Ticket{Tenant: "a", Priority: "batch"}, out)
	enqueue(t, c, "default", admission.Ticket{Tenant: "a", Priority: "default"}, out)
	enqueue(t, c, "interactive", admission.Ticket{Tenant: "a", Priority: "interactive"}, out)
	hold.Release()

	got := drainOrder(t, 3, out)
	if want := []string{"interactive", "default", "batch"}; !slices.Equal(got, want) {
		t.Fatalf("admission order %v, want %v", got, want)
	}
}

func TestAdmit_TenantsAtOnePriorityTakeTurnsAndEachIsFIFO(t *testing.T) {
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 10})
	hold := mustAdmit(t, c, admission.Ticket{Tenant: "x"})
	out := make(chan outcome, 10)
	for i := range 3 {
		enqueue(t, c, fmt.Sprintf("a%d", i), admission.Ticket{Tenant: "a"}, out)
	}
	for i := range 3 {
		enqueue(t, c, fmt.Sprintf("b%d", i), admission.Ticket{Tenant: "b"}, out)
	}
	hold.Release()

	got := drainOrder(t, 6, out)
	if want := []string{"a0", "b0", "a1", "b1", "a2", "b2"}; !slices.Equal(got, want) {
		t.Fatalf("admission order %v, want %v", got, want)
	}
}

func TestAdmit_InteractiveJumpsABatchFloodAndPeersAlternateWithIt(t *testing.T) {
	const flood = 1000
	c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: flood + 2, Priorities: threeLevels})
	hold := mustAdmit(t, c, admission.Ticket{Tenant: "x"})
	out := make(chan outcome, flood+2)
	for i := range flood {
		admitAsync(t.Context(), c, fmt.Sprintf("flood%d", i), admission.Ticket{Tenant: "flooder", Priority: "batch"}, out)
	}
	testkit.WaitFor(t, "the flood queued", func() bool { return c.Queued() == flood })
	enqueue(t, c, "peer", admission.Ticket{Tenant: "peer", Priority: "batch"}, out)
	enqueue(t, c, "interactive", admission.Ticket{Tenant: "user", Priority: "interactive"}, out)
	hold.Release()

	got := drainOrder(t, flood+2, out)
	if got[0] != "interactive" {
		t.Fatalf("first admitted %q, want the interactive request ahead of %d batch ones", got[0], flood)
	}
	// The peer arrived after the whole flood but waits for one flood request at most.
	if i := slices.Index(got, "peer"); i > 2 {
		t.Fatalf("the batch peer was admitted %dth, behind %d of the flood; want turns", i, i-1)
	}
	if c.InFlight() != 0 || c.Queued() != 0 || c.TenantsWaiting() != 0 {
		t.Fatalf("after the drain: in flight %d, queued %d, tenants %d; want 0", c.InFlight(), c.Queued(), c.TenantsWaiting())
	}
}

func TestAdmit_TicketWithoutPriorityTakesTheDefaultLevel(t *testing.T) {
	for _, tc := range []struct {
		name, def, want string
	}{
		{"lowest when unset", "", "batch"},
		{"configured", "default", "default"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := newRecorder()
			c := newController(t, admission.Options{MaxInFlight: 1, QueueSize: 1, Priorities: threeLevels, DefaultPriority: tc.def, Reporter: rec})
			hold := mustAdmit(t, c, admission.Ticket{})
			out := make(chan outcome, 1)
			enqueue(t, c, "unlabelled", admission.Ticket{Tenant: "a"}, out)
			if rec.length(tc.want) != 1 {
				t.Fatalf("queue length at %q is %d, want the unlabelled request there", tc.want, rec.length(tc.want))
			}
			hold.Release()
			receive(t, out).permit.Release()
		})
	}
}

func TestAdmit_UnknownPriorityIsAnError(t *testing.T) {
	c := newController(t, admission.Options{Priorities: threeLevels})
	if _, err := c.Admit(t.Context(), admission.Ticket{Priority: "urgent"}); !errors.Is(err, admission.ErrUnknownPriority) {
		t.Fatalf("Admit with an unknown priority: %v, want ErrUnknownPriority", err)
	}
	if c.InFlight() != 0 {
		t.Fatalf("in flight %d after a refused ticket", c.InFlight())
	}
}
