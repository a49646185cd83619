package policy

import "math/rand/v2"

// NamePowerOfTwo is the policy's --policy name, and the label of its decisions.
const NamePowerOfTwo = "power_of_two"

// PowerOfTwo samples two distinct candidates at random and takes the less loaded one (ties:
// either, at random). Two random choices avoid the herding of a global least-loaded pick while
// keeping the maximum load close to the mean. Load is what --load-signal says (Worker.Load).
type PowerOfTwo struct{ Base }

func (PowerOfTwo) Name() string { return NamePowerOfTwo }

func (PowerOfTwo) Select(in Input) Decision {
	c := in.Candidates
	if len(c) == 1 {
		return in.Pick(c[0], NamePowerOfTwo)
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
	return in.Pick(pick, NamePowerOfTwo)
}
