package policy_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

func keys(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("session-%d", i)
	}
	return out
}

func pick(pol policy.Policy, key string, candidates, all []*workers.Worker) *workers.Worker {
	return pol.Select(policy.Input{Request: &protocol.Request{HashKey: key}, Candidates: candidates, All: all}).Worker
}

func without(ws []*workers.Worker, drop *workers.Worker) []*workers.Worker {
	return slices.DeleteFunc(slices.Clone(ws), func(w *workers.Worker) bool { return w == drop })
}

func shuffled(ws []*workers.Worker, r *rand.Rand) []*workers.Worker {
	out := slices.Clone(ws)
	r.Shuffle(len(out), func(i, j int) { out[i], out[j] = out[j], out[i] })
	return out
}

// --- consistent_hash ---

func TestConsistentHashIsDeterministic(t *testing.T) {
	p := newFleet(t, 8, 1)
	all := p.All()
	a, b := policy.NewConsistentHash(), policy.NewConsistentHash()
	r := rand.New(rand.NewPCG(1, 1))
	for _, k := range keys(500) {
		w := pick(a, k, all, all)
		if again := pick(a, k, all, all); again != w {
			t.Fatalf("key %q: %s then %s", k, w.ID(), again.ID())
		}
		if other := pick(b, k, all, all); other != w {
			t.Fatalf("key %q: two policy instances disagree (%s, %s)", k, w.ID(), other.ID())
		}
		if perm := pick(a, k, shuffled(all, r), all); perm != w {
			t.Fatalf("key %q: candidate order changed the pick", k)
		}
	}
}

// Tenants with the same names in another pool (another router replica) get the same keys.
func TestConsistentHashAgreesAcrossReplicas(t *testing.T) {
	p1, p2 := newFleet(t, 5, 2), newFleet(t, 5, 2)
	a, b := policy.NewConsistentHash(), policy.NewConsistentHash()
	for _, k := range keys(300) {
		w1 := pick(a, k, p1.All(), p1.All())
		w2 := pick(b, k, p2.All(), p2.All())
		if w1.ID() != w2.ID() {
			t.Fatalf("key %q: replica 1 %s, replica 2 %s", k, w1.ID(), w2.ID())
		}
	}
}

func TestConsistentHashSpreadsKeys(t *testing.T) {
	p := newFleet(t, 8, 1)
	all := p.All()
	ch := policy.NewConsistentHash()
	const n = 16000
	got := map[*workers.Worker]int{}
	for _, k := range keys(n) {
		got[pick(ch, k, all, all)]++
	}
	for _, w := range all {
		if c := got[w]; c < n/8/2 || c > n/8*2 { // even share 2000
			t.Errorf("%s owns %d of %d keys; want within [%d, %d]", w.ID(), c, n, n/16, n/4)
		}
	}
}

func TestConsistentHashAddingAWorkerMovesAMinorityOnlyToIt(t *testing.T) {
	p := newFleet(t, 8, 1)
	before := slices.Clone(p.All())
	ch := policy.NewConsistentHash()
	ks := keys(8000)
	owner := map[string]*workers.Worker{}
	for _, k := range ks {
		owner[k] = pick(ch, k, before, before)
	}
	added, err := p.Add("http://10.9.9.9:8000")
	if err != nil {
		t.Fatal(err)
	}
	added[0].SetHealthy(true)
	after := p.All()
	moved := 0
	for _, k := range ks {
		w := pick(ch, k, after, after)
		if w != owner[k] {
			moved++
			if w != added[0] {
				t.Fatalf("key %q moved from %s to %s, not to the new worker", k, owner[k].ID(), w.ID())
			}
		}
	}
	// Expected share of the new worker: 1/9 of the keys.
	if moved == 0 || moved > len(ks)/4 {
		t.Errorf("%d of %d keys moved when a 9th worker joined; want a minority near 1/9", moved, len(ks))
	}
}

func TestConsistentHashRemovingAWorkerMovesOnlyItsKeys(t *testing.T) {
	p := newFleet(t, 6, 1)
	all := slices.Clone(p.All())
	ch := policy.NewConsistentHash()
	gone := all[2]
	owner := map[string]*workers.Worker{}
	for _, k := range keys(3000) {
		owner[k] = pick(ch, k, all, all)
	}
	if _, err := p.Remove(gone.URL()); err != nil {
		t.Fatal(err)
	}
	rest := p.All()
	for k, was := range owner {
		now := pick(ch, k, rest, rest)
		if was != gone && now != was {
			t.Fatalf("key %q moved from %s to %s though its owner stayed", k, was.ID(), now.ID())
		}
		if now == gone {
			t.Fatalf("key %q still on the removed worker", k)
		}
	}
}

// When the owner is unavailable (still registered, not a candidate), the key walks on to the next
// distinct tenant on the ring: exactly the worker that would own it if the owner's points were not
// on the ring at all. Not "the first candidate".
func TestConsistentHashUnavailableOwnerWalksToNextRingNode(t *testing.T) {
	p := newFleet(t, 8, 1)
	all := p.All()
	ch := policy.NewConsistentHash()
	r := rand.New(rand.NewPCG(2, 2))
	fallbacks := map[*workers.Worker]map[*workers.Worker]int{}   // owner -> fallback -> keys
	ringsWithout := map[*workers.Worker]*policy.ConsistentHash{} // owner -> ring without it
	for _, k := range keys(4000) {
		owner := pick(ch, k, all, all)
		cands := without(all, owner)
		fb := pick(ch, k, cands, all)
		if fb == owner {
			t.Fatalf("key %q: fallback is the unavailable owner", k)
		}
		// The ring with the owner's points gone gives the next distinct node clockwise.
		if ringsWithout[owner] == nil {
			ringsWithout[owner] = policy.NewConsistentHash()
		}
		if want := pick(ringsWithout[owner], k, cands, cands); fb != want {
			t.Fatalf("key %q: fallback %s, but the next node on the ring is %s", k, fb.ID(), want.ID())
		}
		// Stable: again, from another candidate order, and with the ring already built.
		if again := pick(ch, k, shuffled(cands, r), all); again != fb {
			t.Fatalf("key %q: fallback moved from %s to %s", k, fb.ID(), again.ID())
		}
		// Keys whose owner is healthy do not move when some other worker is unavailable.
		if other := pick(ch, k, without(all, fb), all); other != owner {
			t.Fatalf("key %q: owner %s available but got %s", k, owner.ID(), other.ID())
		}
		if fallbacks[owner] == nil {
			fallbacks[owner] = map[*workers.Worker]int{}
		}
		fallbacks[owner][fb]++
	}
	// One owner's keys spread over several fallbacks, as its virtual nodes neighbour many others.
	for owner, fbs := range fallbacks {
		if len(fbs) < 4 {
			t.Errorf("keys of %s fall back to only %d workers: %v", owner.ID(), len(fbs), fbs)
		}
	}
}

func TestConsistentHashSkipsEveryUnavailableOwnerInTurn(t *testing.T) {
	p := newFleet(t, 8, 1)
	all := p.All()
	ch := policy.NewConsistentHash()
	for _, k := range keys(200) {
		cands := slices.Clone(all)
		// Take away workers one by one in the order the ring hands them out: each pick must equal
		// the pick of a fresh ring built over the remaining workers only.
		for len(cands) > 1 {
			w := pick(ch, k, cands, all)
			if want := pick(policy.NewConsistentHash(), k, cands, cands); w != want {
				t.Fatalf("key %q with %d candidates: %s, want %s", k, len(cands), w.ID(), want.ID())
			}
			cands = without(cands, w)
		}
	}
}

func TestConsistentHashDataParallelRanksAreDistinctNodes(t *testing.T) {
	p := newFleet(t, 2, 4)
	all := p.All()
	ch := policy.NewConsistentHash()
	got := map[tenant.ID]int{}
	for _, k := range keys(4000) {
		got[pick(ch, k, all, all).ID()]++
	}
	if len(got) != 8 {
		t.Errorf("keys landed on %d of 8 tenants: %v", len(got), got)
	}
}

func TestConsistentHashCandidateMissingFromTheRing(t *testing.T) {
	p := newFleet(t, 3, 1)
	all := p.All()
	late := newFleet(t, 1, 1).All()
	// The caller's snapshot of All predates the candidate: any candidate is an acceptable answer.
	if w := pick(policy.NewConsistentHash(), "k", late, all); w != late[0] {
		t.Errorf("picked %v, want the only candidate", w)
	}
}

func TestConsistentHashRebuildsOnMembershipChange(t *testing.T) {
	p := newFleet(t, 3, 1)
	ch := policy.NewConsistentHash()
	_ = pick(ch, "warm", p.All(), p.All())
	added, _ := p.Add("http://10.9.9.9:8000")
	added[0].SetHealthy(true)
	all := p.All()
	fresh := policy.NewConsistentHash()
	for _, k := range keys(1000) {
		if a, b := pick(ch, k, all, all), pick(fresh, k, all, all); a != b {
			t.Fatalf("key %q: %s from the reused policy, %s from a fresh ring", k, a.ID(), b.ID())
		}
	}
}

// --- rendezvous_hash ---

func TestRendezvousPicksTheHighestScore(t *testing.T) {
	p := newFleet(t, 8, 1)
	all := p.All()
	r := rand.New(rand.NewPCG(3, 3))
	for _, k := range keys(500) {
		best := policy.RendezvousPick(k, all)
		if d := (policy.Rendezvous{}).Select(policy.Input{Request: &protocol.Request{HashKey: k}, Candidates: all, All: all}); d.Worker != best || d.Label != "rendezvous_hash" {
			t.Fatalf("Select disagrees with RendezvousPick for %q", k)
		}
		// The maximum beats every other worker head to head, and any subset containing it.
		for _, w := range all {
			if w != best && policy.RendezvousPick(k, []*workers.Worker{w, best}) != best {
				t.Fatalf("key %q: %s wins against the overall pick %s", k, w.ID(), best.ID())
			}
		}
		sub := shuffled(all, r)[:1+r.IntN(len(all))]
		if slices.Contains(sub, best) && policy.RendezvousPick(k, sub) != best {
			t.Fatalf("key %q: a subset containing the maximum picked another worker", k)
		}
		if policy.RendezvousPick(k, shuffled(all, r)) != best {
			t.Fatalf("key %q: candidate order changed the pick", k)
		}
	}
	if policy.RendezvousPick("k", nil) != nil {
		t.Error("no candidates but a pick")
	}
}

func TestRendezvousSpreadsKeys(t *testing.T) {
	all := newFleet(t, 8, 1).All()
	const n = 16000
	got := map[*workers.Worker]int{}
	for _, k := range keys(n) {
		got[policy.RendezvousPick(k, all)]++
	}
	for _, w := range all {
		if c := got[w]; c < n/16 || c > n/4 {
			t.Errorf("%s owns %d of %d keys", w.ID(), c, n)
		}
	}
}

func TestRendezvousOnlyTheRemovedWorkersKeysMove(t *testing.T) {
	all := newFleet(t, 6, 1).All()
	gone := all[4]
	rest := without(all, gone)
	moved := 0
	for _, k := range keys(6000) {
		was, now := policy.RendezvousPick(k, all), policy.RendezvousPick(k, rest)
		if was != gone && now != was {
			t.Fatalf("key %q moved from %s to %s though its owner stayed", k, was.ID(), now.ID())
		}
		if was == gone {
			moved++
		}
	}
	if moved == 0 {
		t.Error("the removed worker owned no keys")
	}
}

func TestHashPoliciesUseTheHashKey(t *testing.T) {
	p := newFleet(t, 8, 1)
	for _, name := range []string{"consistent_hash", "rendezvous_hash"} {
		pol, _ := policy.New(name, policy.Env{}, nil)
		in := input(p, "alice")
		first := pol.Select(in).Worker
		for range 20 {
			if w := pol.Select(in).Worker; w != first {
				t.Fatalf("%s: same hash key, different workers", name)
			}
		}
		distinct := map[*workers.Worker]bool{}
		for _, k := range keys(200) {
			distinct[pol.Select(input(p, k)).Worker] = true
		}
		if len(distinct) < 6 {
			t.Errorf("%s: 200 keys reached only %d of 8 workers", name, len(distinct))
		}
	}
}

func TestHashPoliciesPlaceRequestsWithoutAKeyByLoad(t *testing.T) {
	p := newFleet(t, 4, 1)
	ws := p.All()
	for _, w := range ws[1:] {
		w.Reserve() // every worker but the first is busy
	}
	for _, name := range []string{"consistent_hash", "rendezvous_hash"} {
		pol, _ := policy.New(name, policy.Env{}, nil)
		for range 10 {
			if w := pol.Select(input(p, "")).Worker; w != ws[0] {
				t.Fatalf("%s: a request without a key went to %s, not to the only idle worker", name, w.Name())
			}
		}
	}
}

func TestConsistentHashHasEnoughVirtualNodes(t *testing.T) {
	if policy.VirtualNodes < 160 {
		t.Errorf("VirtualNodes = %d, want at least 160 per worker", policy.VirtualNodes)
	}
}

// Selections run concurrently with membership changes; run under -race.
func TestPoliciesSelectConcurrentlyWhileMembershipChanges(t *testing.T) {
	p := newFleet(t, 6, 2)
	pols := []policy.Policy{}
	for _, name := range []string{"random", "round_robin", "power_of_two", "consistent_hash", "rendezvous_hash"} {
		pol, _ := policy.New(name, policy.Env{}, nil)
		pols = append(pols, pol)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 50 {
			url := fmt.Sprintf("http://10.8.0.%d:8000", i%5+1)
			if added, err := p.Add(url); err == nil {
				for _, w := range added {
					w.SetHealthy(true)
				}
			} else {
				_, _ = p.Remove(url)
			}
		}
	}()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range 300 {
				in := input(p, fmt.Sprintf("k-%d-%d", g, i))
				for _, pol := range pols {
					d := pol.Select(in)
					if !slices.Contains(in.Candidates, d.Worker) {
						t.Errorf("%s picked a non-candidate", pol.Name())
						return
					}
					d.Worker.Reserve().Release()
				}
			}
		})
	}
	wg.Wait()
	<-done
	for _, w := range p.All() {
		if w.Load() != 0 {
			t.Errorf("%s load %d after every lease was released", w.ID(), w.Load())
		}
	}
}
