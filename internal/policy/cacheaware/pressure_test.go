package cacheaware

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/residency"
	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/session/redistest"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// pressureClock is the residency model's clock in these tests.
type pressureClock struct{ now time.Time }

func (c *pressureClock) Now() time.Time          { return c.now }
func (c *pressureClock) advance(d time.Duration) { c.now = c.now.Add(d) }

// pressured is a cache_aware policy placing by KV room over n workers of capacity tokens each,
// with session admission on.
func pressuredPolicy(t *testing.T, n, capacity int) (*Policy, *workers.Pool, []*workers.Worker, *pressureClock) {
	t.Helper()
	pool, ws := fleet(t, n)
	for _, w := range ws {
		w.SetKVCapacity(int64(capacity))
	}
	c := &pressureClock{now: time.Unix(1000, 0)}
	o := defaultOptions()
	o.Pressure = &PressureOptions{Residency: residency.Options{Now: c.Now}, Admission: true,
		AdmissionTimeout: time.Minute, AdmissionQueue: 16}
	return newPolicy(o), pool, ws, c
}

// turn is one request of session id: a conversation of system and turns, prompt tokens by its
// usage, output tokens out.
type turn struct {
	id     string
	system string
	turns  []string
}

func (tn turn) input(t *testing.T, pool *workers.Pool) policy.Input {
	r := req(t, chat(tn.system, tn.turns, ""), "x-session-id", tn.id)
	body := chat(tn.system, tn.turns, "")
	return policy.Input{Context: context.Background(), Request: r, Model: r.Model, Candidates: pool.All(), All: pool.All(),
		Size: len(body)}
}

// run selects, accepts and ends one turn (usage: the prompt at 4 bytes a token, 50 output
// tokens), as the proxy does; it returns the decision.
func run(t *testing.T, p *Policy, in policy.Input) policy.Decision {
	t.Helper()
	d := p.Select(in)
	if d.Hold != nil || d.Worker == nil {
		return d
	}
	p.Accepted(in, d)
	p.FirstByte(in, d, 100*time.Millisecond)
	p.Done(in, d, workers.Succeeded, policy.Usage{Known: true, Prompt: in.Size / 4, Output: 50, Cached: 0})
	return d
}

func TestAResidentSessionStaysOnItsWorkerTurnAfterTurn(t *testing.T) {
	p, pool, _, _ := pressuredPolicy(t, 4, 1_000_000)
	tn := turn{id: "a", system: "you are helpful"}
	var first string
	for i := 0; i < 5; i++ {
		tn.turns = append(tn.turns, fmt.Sprintf("question %d %s", i, strings.Repeat("x", 400)))
		d := run(t, p, tn.input(t, pool))
		switch {
		case i == 0 && d.Label != LabelKVRoom:
			t.Fatalf("first turn: %s, want %s", d.Label, LabelKVRoom)
		case i == 0:
			first = d.Worker.Name()
		case d.Label != LabelSessionMatch || d.Worker.Name() != first:
			t.Fatalf("turn %d: %s on %s, want %s on %s", i, d.Label, d.Worker.Name(), LabelSessionMatch, first)
		case d.Match <= 0:
			t.Fatalf("turn %d: predicted match %v, want the last prompt held", i, d.Match)
		}
	}
}

// Eight sessions that share a long system prompt start on an idle fleet of four: the prefix is
// worth one prefill per worker, not every session on the worker that computed it first.
func TestSessionsSharingAPrefixSpreadOverAnIdleFleet(t *testing.T) {
	p, pool, _, _ := pressuredPolicy(t, 4, 1_000_000)
	system := strings.Repeat("shared tools and system prompt ", 4000)
	per := map[string]int{}
	home := map[string]string{}
	for turnNo := 0; turnNo < 3; turnNo++ {
		for s := 0; s < 8; s++ {
			id := fmt.Sprintf("s%d", s)
			tn := turn{id: id, system: system}
			for k := 0; k <= turnNo; k++ {
				tn.turns = append(tn.turns, fmt.Sprintf("%s turn %d", id, k))
			}
			d := run(t, p, tn.input(t, pool))
			if turnNo == 0 {
				per[d.Worker.Name()]++
				home[id] = d.Worker.Name()
			} else if d.Worker.Name() != home[id] || d.Label != LabelSessionMatch {
				t.Fatalf("%s turn %d: %s on %s, want it to stay on %s", id, turnNo, d.Label, d.Worker.Name(), home[id])
			}
		}
	}
	for w, n := range per {
		if n > 3 {
			t.Fatalf("%s holds %d of 8 sessions (%v), want at most 3", w, n, per)
		}
	}
}

// Eight new sessions whose Selects all run before any is accepted (a burst arriving at once)
// spread as if placed one after another: each placement claims its worker from the moment it is
// chosen.
func TestNewSessionsChosenBeforeAnyIsAcceptedSpread(t *testing.T) {
	p, pool, _, _ := pressuredPolicy(t, 4, 1_000_000)
	system := strings.Repeat("shared tools and system prompt ", 4000)
	var ins []policy.Input
	var decs []policy.Decision
	per := map[string]int{}
	for s := range 8 {
		in := turn{id: fmt.Sprintf("s%d", s), system: system, turns: []string{"start"}}.input(t, pool)
		d := p.Select(in)
		if d.Worker == nil || d.Label != LabelKVRoom {
			t.Fatalf("session %d: %+v, want %s", s, d, LabelKVRoom)
		}
		ins, decs = append(ins, in), append(decs, d)
		per[d.Worker.Name()]++
	}
	for w, n := range per {
		if n != 2 {
			t.Fatalf("%s took %d of 8 sessions (%v), want 2 each", w, n, per)
		}
	}
	for i := range ins {
		p.Accepted(ins[i], decs[i])
	}
	if n := len(p.pressure.claims.by); n != 0 {
		t.Fatalf("%d claims left once every placement was accepted, want none", n)
	}
}

// A placement the proxy never makes (its worker's breaker refused it, its client left) counts on
// its worker only until its claim lapses.
func TestANewSessionsClaimLapsesWhenItIsNeverAccepted(t *testing.T) {
	p, pool, _, clock := pressuredPolicy(t, 2, 1_000_000)
	first := p.Select(turn{id: "a", system: "sys", turns: []string{"hi"}}.input(t, pool))
	second := p.Select(turn{id: "b", system: "sys", turns: []string{"hi"}}.input(t, pool))
	if first.Worker == second.Worker {
		t.Fatalf("both unaccepted placements went to %s, want the second on the other worker", first.Worker.Name())
	}
	if n := p.pressure.claims.onWorker(first.Worker.ID()); n != 1 {
		t.Fatalf("%d claims on %s, want 1", n, first.Worker.Name())
	}
	clock.advance(claimTTL)
	if n := p.pressure.claims.onWorker(first.Worker.ID()); n != 0 {
		t.Fatalf("%d claims on %s after %v, want none", n, first.Worker.Name(), claimTTL)
	}
	if n := len(p.pressure.claims.by); n != 0 {
		t.Fatalf("%d lapsed claims kept, want none", n)
	}
}

func TestASessionNoWorkerHasRoomForWaitsThenIsPlaced(t *testing.T) {
	p, pool, _, c := pressuredPolicy(t, 2, 10_000)
	// Two sessions of 6,000 tokens fill both workers' room (9,000 each, with the headroom).
	for _, id := range []string{"a", "b"} {
		in := turn{id: id, system: strings.Repeat("y", 24_000)}.input(t, pool)
		if d := run(t, p, in); d.Worker == nil {
			t.Fatalf("session %s held with room to spare", id)
		}
	}
	in := turn{id: "c", system: strings.Repeat("z", 24_000)}.input(t, pool)
	d := p.Select(in)
	if d.Hold == nil || d.Worker != nil || d.Hold.Need < in.Size/4*99/100 || d.Hold.Need > in.Size/4 || d.Hold.Served != 0 {
		t.Fatalf("third session: %+v, want a hold of its %d tokens", d, in.Size/4)
	}
	// Its wait is over: it is placed anyway.
	in.Held, in.HoldOver = true, true
	if d := p.Select(in); d.Worker == nil || d.Label != LabelKVRoomExhausted {
		t.Fatalf("after its wait: %+v, want %s", d, LabelKVRoomExhausted)
	}
	// Room appears when a session pauses past its horizon: a waiting session is placed there.
	c.advance(time.Hour)
	in.HoldOver = false
	if d := p.Select(in); d.Worker == nil || d.Label != LabelKVRoomWaited {
		t.Fatalf("with room again: %+v, want %s", d, LabelKVRoomWaited)
	}
}

func TestAResidentSessionMovesWhenItsWorkersQueueCostsMoreThanComputingItAgain(t *testing.T) {
	p, pool, ws, _ := pressuredPolicy(t, 2, 1_000_000)
	tn := turn{id: "a", system: strings.Repeat("q", 4000)}
	d := run(t, p, tn.input(t, pool))
	home := d.Worker
	other := ws[0]
	if other == home {
		other = ws[1]
	}
	// A million tokens of prefill queue on its worker: computing its 1,000 again elsewhere is
	// far sooner.
	at := pool.Acquire(home)
	at.Prefill(1_000_000)
	defer at.Close(workers.Succeeded)
	if d := p.Select(tn.input(t, pool)); d.Worker != other || d.Label != LabelSessionMoved {
		t.Fatalf("with a long queue on its worker: %s on %v, want %s on %s", d.Label, d.Worker.Name(), LabelSessionMoved, other.Name())
	}
}

func TestASessionPushedOutOfItsWorkersCacheIsPlacedAnew(t *testing.T) {
	p, pool, _, c := pressuredPolicy(t, 1, 10_000)
	a := turn{id: "a", system: strings.Repeat("a", 20_000)}
	run(t, p, a.input(t, pool))
	c.advance(time.Hour) // a pauses: b may take the room, and the engine evicts a for it
	run(t, p, turn{id: "b", system: strings.Repeat("b", 24_000)}.input(t, pool))
	c.advance(time.Hour) // b pauses too: there is room for a again, but not its cache
	if d := p.Select(a.input(t, pool)); d.Label != LabelSessionEvicted {
		t.Fatalf("a after b filled the cache: %s, want %s", d.Label, LabelSessionEvicted)
	}
}

func TestASessionAnotherReplicaPlacedStaysWhereTheSharedStoreSays(t *testing.T) {
	pool, ws := fleet(t, 3)
	for _, w := range ws {
		w.SetKVCapacity(1_000_000)
	}
	store := session.NewMemory(session.MemoryOptions{})
	o := defaultOptions()
	o.Store = store
	o.Pressure = &PressureOptions{Admission: true, AdmissionTimeout: time.Minute, AdmissionQueue: 16}
	p := newPolicy(o)
	if err := store.Set(context.Background(), DefaultModel, "session:a", ws[2].ID()); err != nil {
		t.Fatal(err)
	}
	r := req(t, chat("sys", []string{"hello"}, ""), "x-session-id", "a")
	in := policy.Input{Context: context.Background(), Request: r, Candidates: pool.All(), All: pool.All(), Size: 400}
	if d := p.Select(in); d.Worker != ws[2] || d.Label != LabelSessionMatch {
		t.Fatalf("%s on %v, want %s on the worker the store names", d.Label, d.Worker.Name(), LabelSessionMatch)
	}
}

func TestWithoutAKnownCapacityTheChainPlaces(t *testing.T) {
	pool, _ := fleet(t, 2)
	o := defaultOptions()
	o.Pressure = DefaultKnobs().pressure()
	p := newPolicy(o)
	d := route(p, pool, req(t, chat("sys", []string{"hello"}, ""), "x-session-id", "a"))
	if d.Label == LabelKVRoom || d.TTFT != 0 {
		t.Fatalf("%s, predicted TTFT %v: the pressure model placed a request though no capacity is known", d.Label, d.TTFT)
	}
}

func TestPressureLearnsWhatATokenCostsOnEachWorker(t *testing.T) {
	p, pool, _, c := pressuredPolicy(t, 1, 1_000_000)
	fresh := turn{id: "fresh", system: strings.Repeat("f", 40_000)}.input(t, pool)
	before := p.Select(fresh).TTFT
	for i := 0; i < 200; i++ {
		in := turn{id: fmt.Sprint(i), system: fmt.Sprint(i) + strings.Repeat("w", 40_000)}.input(t, pool)
		d := p.Select(in)
		p.Accepted(in, d)
		p.FirstByte(in, d, 5*time.Second) // far slower than the prior: 10,000 tokens in 5 s
		p.Done(in, d, workers.Succeeded, policy.Usage{Known: true, Prompt: 10_000, Output: 10})
		c.advance(time.Hour) // the session ends: its room is free for the next
	}
	if after := p.Select(fresh).TTFT; after < 3*before {
		t.Fatalf("predicted TTFT %v after 200 answers of 5 s, %v before: the rate was not learned", after, before)
	}
}

func TestReplicasSharingARedisStoreCountEachOthersSessionsAgainstTheRoom(t *testing.T) {
	srv := redistest.Start(t)
	pool, ws := fleet(t, 2)
	for _, w := range ws {
		w.SetKVCapacity(10_000)
	}
	c := &pressureClock{now: time.Unix(1000, 0)}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	replica := func() *Policy {
		store, err := session.NewRedis(session.RedisOptions{URL: srv.URL(), Timeout: 2 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = store.Close() })
		o := defaultOptions()
		o.Store = store
		o.Pressure = &PressureOptions{Residency: residency.Options{Now: c.Now}, Admission: true,
			AdmissionTimeout: time.Minute, AdmissionQueue: 16}
		p := newPolicy(o)
		go p.Run(ctx)
		return p
	}
	a, b := replica(), replica()
	// a places two sessions of 6,000 tokens, which fill both workers' room; b hears of them (the
	// subscriptions start in the background: a's turns repeat until b knows both, bounded).
	for i := 0; i < 100 && b.pressure.res.Len() < 2; i++ {
		for _, id := range []string{"a", "b"} {
			if d := run(t, a, turn{id: id, system: strings.Repeat("y", 24_000)}.input(t, pool)); d.Worker == nil {
				t.Fatalf("session %s held with room to spare", id)
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	if n := b.pressure.res.Len(); n != 2 {
		t.Fatalf("replica b follows %d sessions, want the 2 replica a placed", n)
	}
	// A new session at b waits for room, as it would at a.
	in := turn{id: "c", system: strings.Repeat("z", 24_000)}.input(t, pool)
	if d := b.Select(in); d.Hold == nil {
		t.Fatalf("a new session at replica b: %s on %v, want it held: a's sessions fill the room", d.Label, d.Worker)
	}
}
