package policy_test

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// newFleet registers n healthy workers (dp ranks each, 1 for none) and returns the pool.
func newFleet(t testing.TB, n, dp int) *workers.Pool {
	t.Helper()
	p := workers.NewPool(workers.Options{DPSize: dp, CBFailureThreshold: 1, CBTimeout: time.Hour})
	for i := range n {
		added, err := p.Add(fmt.Sprintf("http://10.0.%d.%d:8000", i/250, i%250+1))
		if err != nil {
			t.Fatal(err)
		}
		for _, w := range added {
			w.SetHealthy(true)
		}
	}
	return p
}

func input(p *workers.Pool, hashKey string) policy.Input {
	c, _, _ := p.Candidates("")
	return policy.Input{Request: &protocol.Request{HashKey: hashKey}, Candidates: c, All: p.All()}
}

// counts selects n times and counts the picks by tenant.
func counts(t *testing.T, pol policy.Policy, in policy.Input, n int) map[tenant.ID]int {
	t.Helper()
	got := map[tenant.ID]int{}
	for range n {
		d := pol.Select(in)
		if d.Worker == nil {
			t.Fatal("Select returned no worker")
		}
		if !slices.Contains(in.Candidates, d.Worker) {
			t.Fatalf("%s picked %s, not a candidate", pol.Name(), d.Worker.ID())
		}
		if d.Label != pol.Name() {
			t.Fatalf("label %q, want the policy name %q", d.Label, pol.Name())
		}
		if d.Match != 0 {
			t.Fatalf("baseline policy predicted a match of %v", d.Match)
		}
		got[d.Worker.ID()]++
	}
	return got
}

func TestRoundRobinCyclesThroughCandidates(t *testing.T) {
	p := newFleet(t, 3, 1)
	rr := &policy.RoundRobin{}
	in := input(p, "")
	var got []tenant.ID
	for range 7 {
		got = append(got, rr.Select(in).Worker.ID())
	}
	all := p.All()
	want := []tenant.ID{all[0].ID(), all[1].ID(), all[2].ID(), all[0].ID(), all[1].ID(), all[2].ID(), all[0].ID()}
	if !slices.Equal(got, want) {
		t.Errorf("sequence %v, want %v", got, want)
	}
}

func TestRoundRobinSkipsUnavailableWorkers(t *testing.T) {
	p := newFleet(t, 4, 1)
	all := p.All()
	all[1].SetHealthy(false)
	all[3].Breaker().Record(false) // threshold 1: open
	rr := &policy.RoundRobin{}
	in := input(p, "")
	if len(in.Candidates) != 2 {
		t.Fatalf("%d candidates, want 2", len(in.Candidates))
	}
	got := counts(t, rr, in, 100)
	if got[all[0].ID()] != 50 || got[all[2].ID()] != 50 || len(got) != 2 {
		t.Errorf("picks %v, want 50 each on the two available workers", got)
	}
	// Consecutive picks alternate.
	prev := rr.Select(in).Worker
	for range 10 {
		w := rr.Select(in).Worker
		if w == prev {
			t.Fatalf("%s picked twice in a row", w.ID())
		}
		prev = w
	}
}

func TestRoundRobinOverDataParallelTenants(t *testing.T) {
	p := newFleet(t, 2, 2)
	rr := &policy.RoundRobin{}
	got := counts(t, rr, input(p, ""), 40)
	if len(got) != 4 {
		t.Fatalf("picked %d tenants, want all 4 ranks: %v", len(got), got)
	}
	for tenant, n := range got {
		if n != 10 {
			t.Errorf("%s picked %d times, want 10", tenant, n)
		}
	}
}

func TestRandomPicksOnlyCandidatesAndEachOfThem(t *testing.T) {
	p := newFleet(t, 5, 1)
	all := p.All()
	all[0].SetHealthy(false)
	all[4].SetHealthy(false)
	got := counts(t, policy.Random{}, input(p, ""), 3000)
	if len(got) != 3 {
		t.Fatalf("picked %v, want exactly the 3 candidates", got)
	}
	for tenant, n := range got {
		if n < 700 { // expected 1000
			t.Errorf("%s picked only %d of 3000 times", tenant, n)
		}
	}
}

func TestPowerOfTwoPrefersTheLessLoaded(t *testing.T) {
	p := newFleet(t, 2, 1)
	all := p.All()
	for range 3 {
		defer all[0].Reserve().Release()
	}
	got := counts(t, policy.PowerOfTwo{}, input(p, ""), 200)
	if got[all[1].ID()] != 200 {
		t.Errorf("picks %v: with two candidates the less loaded must always win", got)
	}
}

func TestPowerOfTwoNeverPicksTheBusiestOfMany(t *testing.T) {
	p := newFleet(t, 6, 1)
	all := p.All()
	busiest := all[2]
	for range 10 {
		defer busiest.Reserve().Release()
	}
	for i, w := range all {
		if w != busiest {
			for range i % 3 {
				defer w.Reserve().Release()
			}
		}
	}
	got := counts(t, policy.PowerOfTwo{}, input(p, ""), 3000)
	if got[busiest.ID()] != 0 {
		t.Errorf("the busiest worker, which loses every pairing, was picked %d times", got[busiest.ID()])
	}
	// The idle workers (loads 0) win every pairing they are in: at least 2/6 of draws each minus
	// their head-to-head; expected about 0.3.
	for _, i := range []int{0, 3} {
		if n := got[all[i].ID()]; n < 600 {
			t.Errorf("idle worker %d picked only %d of 3000 times", i, n)
		}
	}
}

func TestPowerOfTwoOnlyCandidatesAndSpreadsTies(t *testing.T) {
	p := newFleet(t, 4, 1)
	all := p.All()
	all[3].SetHealthy(false)
	got := counts(t, policy.PowerOfTwo{}, input(p, ""), 3000)
	if len(got) != 3 {
		t.Fatalf("picked %v, want the 3 candidates", got)
	}
	for tenant, n := range got {
		if n < 700 {
			t.Errorf("idle %s picked only %d of 3000 times", tenant, n)
		}
	}
	one := policy.Input{Request: &protocol.Request{}, Candidates: all[:1], All: all}
	if w := (policy.PowerOfTwo{}).Select(one).Worker; w != all[0] {
		t.Errorf("single candidate: picked %s", w.ID())
	}
}

func TestLeastLoadedPicksTheMinimum(t *testing.T) {
	p := newFleet(t, 4, 1)
	all := p.All()
	loads := []int{3, 1, 2, 5}
	for i, w := range all {
		for range loads[i] {
			defer w.Reserve().Release()
		}
	}
	for range 50 {
		if w := policy.LeastLoaded(all); w != all[1] {
			t.Fatalf("picked %s (load %d), want the load-1 worker", w.ID(), w.Load())
		}
	}
	if policy.LeastLoaded(nil) != nil {
		t.Error("LeastLoaded(nil) is not nil")
	}
}

// Ties are broken at random: an idle fleet must not send everything to the first worker.
func TestLeastLoadedSpreadsTiesOverEveryTiedWorker(t *testing.T) {
	p := newFleet(t, 6, 1)
	all := p.All()
	// Loads 1,0,0,2,0,1: workers 1, 2 and 4 are tied at 0.
	for i, l := range []int{1, 0, 0, 2, 0, 1} {
		for range l {
			defer all[i].Reserve().Release()
		}
	}
	const draws = 3000
	got := map[*workers.Worker]int{}
	for range draws {
		got[policy.LeastLoaded(all)]++
	}
	for _, i := range []int{1, 2, 4} {
		if got[all[i]] < draws/3-250 { // expected 1000 each
			t.Errorf("tied worker %d picked %d of %d times", i, got[all[i]], draws)
		}
	}
	if len(got) != 3 {
		t.Errorf("picked %d distinct workers, want only the 3 tied at the minimum", len(got))
	}

	idle := newFleet(t, 4, 1).All()
	seen := map[*workers.Worker]int{}
	for range 2000 {
		seen[policy.LeastLoaded(idle)]++
	}
	for i, w := range idle {
		if seen[w] < 350 { // expected 500
			t.Errorf("idle fleet: worker %d picked %d of 2000 times", i, seen[w])
		}
	}
}

func TestHash64IsStable(t *testing.T) {
	// Every router replica, and every version, must map a key to the same worker: these values
	// (FNV-1a 64 then the SplitMix64 finaliser) are part of the routing contract.
	golden := map[string]uint64{
		"":                       0xf52a15e9a9b5e89b,
		"session-1":              0x8f9d4a83e2384785,
		"http://10.0.0.1:8000#0": 0x4b9e84ae7bca1d6f,
	}
	for s, want := range golden {
		if got := policy.Hash64(s); got != want {
			t.Errorf("Hash64(%q) = %#x, want %#x", s, got, want)
		}
	}
	if policy.Hash64("session-1") == policy.Hash64("session-12") {
		t.Error("Hash64 collides on near keys")
	}
}
