package policy

import (
	"hash/fnv"
	"slices"
	"strconv"
	"sync"

	"github.com/cacheroute/cacheroute/internal/workers"
)

// Hash64 is the 64-bit hash of both hash policies: FNV-1a followed by a SplitMix64 finaliser for
// good avalanche. It is stable across processes and versions, so every router replica maps a key
// to the same worker.
func Hash64(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s))
	return mix64(h.Sum64())
}

func mix64(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// VirtualNodes is how many points each worker tenant gets on the consistent-hash ring; enough that
// every worker's share of the key space stays within a few percent of even.
const VirtualNodes = 160

// NameConsistentHash is the policy's --policy name, and the label of its decisions.
const NameConsistentHash = "consistent_hash"

// ConsistentHash maps the request's hash key onto a ring of VirtualNodes points per tenant and
// takes the first point clockwise. Adding or removing a worker moves only the keys next to its
// points. When the owning tenant is unavailable it walks on to the next distinct tenant on the
// ring, so a key's fallback is as stable as its owner.
type ConsistentHash struct {
	Base
	mu   sync.Mutex
	ring *ring
}

type ring struct {
	members []*workers.Worker // the snapshot the ring was built from
	points  []ringPoint       // sorted by hash
}

type ringPoint struct {
	hash   uint64
	worker *workers.Worker
}

// NewConsistentHash returns a policy whose ring is built on first use and rebuilt whenever the
// pool's membership changes.
func NewConsistentHash() *ConsistentHash { return &ConsistentHash{} }

func (*ConsistentHash) Name() string { return NameConsistentHash }

// Select places the hash key on the ring. A request with no key at all (the load-only routes,
// whose readers derive none) has nothing to keep together: it goes to the least-loaded candidate.
func (p *ConsistentHash) Select(in Input) Decision {
	if in.Request.HashKey == "" {
		return in.Pick(LeastLoaded(in.Candidates), NameConsistentHash)
	}
	r := p.ringFor(in.All)
	key := Hash64(in.Request.HashKey)
	start, _ := slices.BinarySearchFunc(r.points, key, func(pt ringPoint, k uint64) int {
		switch {
		case pt.hash < k:
			return -1
		case pt.hash > k:
			return 1
		}
		return 0
	})
	for i := range r.points {
		w := r.points[(start+i)%len(r.points)].worker
		if slices.Contains(in.Candidates, w) {
			return in.Pick(w, NameConsistentHash)
		}
	}
	// Candidates not on the ring (registered after the snapshot the caller read): any will do.
	return in.Pick(in.Candidates[0], NameConsistentHash)
}

func (p *ConsistentHash) ringFor(all []*workers.Worker) *ring {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.ring != nil && slices.Equal(p.ring.members, all) {
		return p.ring
	}
	r := &ring{members: slices.Clone(all), points: make([]ringPoint, 0, len(all)*VirtualNodes)}
	for _, w := range all {
		for v := range VirtualNodes {
			r.points = append(r.points, ringPoint{hash: Hash64(string(w.ID()) + "#" + strconv.Itoa(v)), worker: w})
		}
	}
	slices.SortFunc(r.points, func(a, b ringPoint) int {
		switch {
		case a.hash < b.hash:
			return -1
		case a.hash > b.hash:
			return 1
		}
		return 0
	})
	p.ring = r
	return r
}

// NameRendezvous is the policy's --policy name, and the label of its decisions.
const NameRendezvous = "rendezvous_hash"

// Rendezvous (highest random weight) scores every candidate by the hash of (key, tenant) and takes
// the highest. Unlike a ring it needs no state, and when a worker leaves only its own keys move,
// each to its own second choice.
type Rendezvous struct{ Base }

func (Rendezvous) Name() string { return NameRendezvous }

// Select picks the highest score for the hash key; a request with no key at all goes to the
// least-loaded candidate, as for the ring.
func (Rendezvous) Select(in Input) Decision {
	if in.Request.HashKey == "" {
		return in.Pick(LeastLoaded(in.Candidates), NameRendezvous)
	}
	return in.Pick(RendezvousPick(in.Request.HashKey, in.Candidates), NameRendezvous)
}

// RendezvousPick returns the candidate with the highest rendezvous score for key.
func RendezvousPick(key string, candidates []*workers.Worker) *workers.Worker {
	k := Hash64(key)
	var best *workers.Worker
	var bestScore uint64
	for _, w := range candidates {
		if s := mix64(k ^ Hash64(string(w.ID()))); best == nil || s > bestScore {
			best, bestScore = w, s
		}
	}
	return best
}
