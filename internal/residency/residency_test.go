package residency

import (
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

func newTracker(c *testkit.Clock) *Tracker {
	return New(Options{Now: c.Now, MinLive: time.Second, MaxLive: time.Minute, FirstLive: 10 * time.Second})
}

// trackerOnW is a tracker on a manual clock that knows one worker, "w", of capacity tokens.
func trackerOnW(capacity int) (*Tracker, *testkit.Clock) {
	c := testkit.NewClock()
	tr := newTracker(c)
	tr.SetCapacity("w", capacity)
	return tr, c
}

func TestASessionIsResidentWhileTheSessionsServedSinceFitTheCapacity(t *testing.T) {
	c := testkit.NewClock()
	tr := newTracker(c)
	tr.SetCapacity("w", 1000)
	for _, k := range []string{"a", "b", "c"} {
		tr.Started(k, "w", 400)
		tr.Ended(k, 400, 0, true)
		c.Advance(time.Millisecond)
	}
	// Most recently used first: c (400), b (800), a (1200 > 1000): a is evicted by LRU.
	for k, want := range map[string]bool{"c": true, "b": true, "a": false} {
		s, ok := tr.Session(k)
		if !ok || s.Resident != want {
			t.Errorf("session %s: resident %v (known %v), want %v", k, s.Resident, ok, want)
		}
	}
	// a runs again: it is the most recent now, and b falls out instead of it.
	tr.Started("a", "w", 400)
	if s, _ := tr.Session("b"); s.Resident {
		t.Error("b still resident after a's turn pushed it past the capacity")
	}
}

func TestRoomCountsLiveSessionsOnlyWithinTheirHorizon(t *testing.T) {
	tr, c := trackerOnW(10000)
	if room, ok := tr.Room("w"); !ok || room != 9000 {
		t.Fatalf("empty worker's room %d (%v), want 9000: the capacity less the headroom", room, ok)
	}
	tr.Started("a", "w", 3000)
	if room, _ := tr.Room("w"); room != 6000 {
		t.Fatalf("room %d with a's turn in flight, want 6000", room)
	}
	tr.Ended("a", 3000, 500, true)
	if room, _ := tr.Room("w"); room != 5500 {
		t.Fatalf("room %d after a's turn ended with 500 output tokens, want 5500", room)
	}
	c.Advance(11 * time.Second) // past the first turn's horizon
	if room, _ := tr.Room("w"); room != 9000 {
		t.Fatalf("room %d once a went idle past its horizon, want 9000", room)
	}
	if s, _ := tr.Session("a"); !s.Resident || s.Live {
		t.Fatalf("idle a: %+v, want resident and not live", s)
	}
}

func TestTheHorizonFollowsTheSessionsOwnPauses(t *testing.T) {
	tr, c := trackerOnW(10000)
	for i := 0; i < 5; i++ {
		tr.Started("a", "w", 100)
		c.Advance(time.Second)
		tr.Ended("a", 100, 10, true)
		c.Advance(5 * time.Second) // a pauses 5 s between turns
	}
	// Its horizon is 4 pauses: 20 s after its last turn it is still live; at 21 s it is not.
	c.Advance(14 * time.Second) // 19 s since the last end
	if s, _ := tr.Session("a"); !s.Live {
		t.Fatal("a not live 19 s after its turn, with 5 s pauses and 4 pauses of horizon")
	}
	c.Advance(2 * time.Second)
	if s, _ := tr.Session("a"); s.Live {
		t.Fatal("a still live 21 s after its turn")
	}
}

func TestAnEvictedSessionIsNeitherResidentNorLiveUntilItRunsAgain(t *testing.T) {
	tr, _ := trackerOnW(10000)
	tr.Started("a", "w", 3000)
	tr.Ended("a", 3000, 0, true)
	tr.Evicted("a")
	s, _ := tr.Session("a")
	if s.Resident || s.Live {
		t.Fatalf("evicted a: %+v", s)
	}
	if room, _ := tr.Room("w"); room != 9000 {
		t.Fatalf("room %d with a evicted, want 9000", room)
	}
	tr.Started("a", "w", 3100)
	if s, _ := tr.Session("a"); !s.Resident || !s.Live || s.Served != 6100 || s.Turns != 2 {
		t.Fatalf("a after its next turn: %+v", s)
	}
}

func TestASessionMovesWithItsTurnAndStartsAnew(t *testing.T) {
	c := testkit.NewClock()
	tr := newTracker(c)
	tr.SetCapacity("w1", 10000)
	tr.SetCapacity("w2", 10000)
	tr.Started("a", "w1", 3000)
	tr.Ended("a", 3000, 100, true)
	tr.Started("a", "w2", 3200)
	if r1, _ := tr.Room("w1"); r1 != 9000 {
		t.Errorf("w1's room %d after a moved away, want 9000", r1)
	}
	if r2, _ := tr.Room("w2"); r2 != 5800 {
		t.Errorf("w2's room %d with a's turn, want 5800", r2)
	}
	if n := tr.Live("w2"); n != 1 {
		t.Errorf("w2 has %d live sessions, want 1", n)
	}
}

func TestTheTrackerForgetsTheLeastRecentlyUsedSessionsPastItsBound(t *testing.T) {
	c := testkit.NewClock()
	tr := New(Options{Now: c.Now, MaxSessions: 2})
	for _, k := range []string{"a", "b", "c"} {
		tr.Started(k, "w", 10)
		tr.Ended(k, 10, 0, true)
	}
	if _, ok := tr.Session("a"); ok || tr.Len() != 2 {
		t.Fatalf("a still followed (%d sessions) past a bound of 2", tr.Len())
	}
	tr.RemoveWorker("w")
	if tr.Len() != 0 {
		t.Fatalf("%d sessions left after their worker was removed", tr.Len())
	}
}

func TestAWorkerOfUnknownCapacityHasNoRoomFigure(t *testing.T) {
	tr := New(Options{})
	tr.Started("a", "w", 10)
	if _, ok := tr.Room("w"); ok {
		t.Fatal("room reported for a worker whose capacity is unknown")
	}
	if s, _ := tr.Session("a"); !s.Resident {
		t.Fatal("a session on a worker of unknown capacity is not resident")
	}
}
