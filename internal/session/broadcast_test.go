package session_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/session/redistest"
)

// received collects what a replica's broadcast handed it.
type received struct {
	mu   sync.Mutex
	msgs []string
}

func (r *received) add(b []byte) { r.mu.Lock(); r.msgs = append(r.msgs, string(b)); r.mu.Unlock() }
func (r *received) list() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.msgs...)
}

func TestABroadcastReachesTheOtherReplicasButNotItsSender(t *testing.T) {
	srv := redistest.Start(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	a := newRedis(t, srv, session.RedisOptions{}).Broadcast("residency")
	b := newRedis(t, srv, session.RedisOptions{}).Broadcast("residency")
	other := newRedis(t, srv, session.RedisOptions{}).Broadcast("elsewhere")
	var atA, atB, atOther received
	go a.Run(ctx, atA.add)
	go b.Run(ctx, atB.add)
	go other.Run(ctx, atOther.add)

	// The subscriptions are made in the background: send until b hears one (bounded).
	heard := false
	for i := 0; i < 100 && !heard; i++ {
		if !a.Send([]byte(fmt.Sprintf("ping %d", i))) {
			t.Fatal("a small message was dropped")
		}
		time.Sleep(50 * time.Millisecond)
		heard = len(atB.list()) > 0
	}
	if !heard {
		t.Fatal("b heard nothing of a in 5 s")
	}
	before := len(atB.list())
	for i := range 3 {
		a.Send([]byte(fmt.Sprintf("change %d", i)))
	}
	for i := 0; i < 100 && len(atB.list()) < before+3; i++ {
		time.Sleep(20 * time.Millisecond)
	}
	got := atB.list()[before:]
	if len(got) != 3 || got[0] != "change 0" || got[2] != "change 2" {
		t.Fatalf("b heard %q after the pings, want the 3 changes in order", got)
	}
	if n := len(atA.list()); n != 0 {
		t.Fatalf("a heard %d of its own messages", n)
	}
	if n := len(atOther.list()); n != 0 {
		t.Fatalf("a replica on another channel heard %d messages", n)
	}
	if a.Send(make([]byte, 16<<10+1)) || a.Send(nil) {
		t.Fatal("an empty or oversized message was queued")
	}
}
