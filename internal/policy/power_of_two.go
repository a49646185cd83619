package policy

import "math/rand/v2"

// PowerOfTwo samples two distinct candidates at random and takes the one with fewer requests in
// flight (ties: either, at random). Two random choices avoid the herding of a global least-loaded
// pick while keeping the maximum load close to the mean. Load is the router's own in-flight count:
// vLLM exposes no cheap per-request load endpoint.
type PowerOfTwo struct{ Stateless }

func (PowerOfTwo) Name() string { return "power_of_two" }

func (PowerOfTwo) Select(in Input) Decision {
	c := in.Candidates
	if len(c) == 1 {
		return Decision{Worker: c[0], Label: "power_of_two"}
	}
	i := rand.IntN(len(c))
	j := rand.IntN(len(c) - 1)
	if j >= i {
		j++
	}
	a, b := c[i], c[j]
	pick := a
	if b.Load() < a.Load() || (b.Load() == a.Load() && rand.IntN(2) == 0) {
		pick = b
	}
	return Decision{Worker: pick, Label: "power_of_two"}
}
