package policy

import "math/rand/v2"

// NameRandom is the policy's --policy name, and the label of its decisions.
const NameRandom = "random"

// Random picks a candidate uniformly at random: no state, no coordination, and over many requests
// an even spread, but no affinity at all.
type Random struct{ Base }

func (Random) Name() string { return NameRandom }

func (Random) Select(in Input) Decision {
	return in.Pick(in.Candidates[rand.IntN(len(in.Candidates))], NameRandom)
}
