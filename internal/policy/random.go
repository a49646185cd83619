package policy

import "math/rand/v2"

// Random picks a candidate uniformly at random: no state, no coordination, and over many requests
// an even spread, but no affinity at all.
type Random struct{ Stateless }

func (Random) Name() string { return "random" }

func (Random) Select(in Input) Decision {
	return Decision{Worker: in.Candidates[rand.IntN(len(in.Candidates))], Label: "random"}
}
