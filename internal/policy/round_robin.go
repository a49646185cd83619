package policy

import "sync/atomic"

// NameRoundRobin is the policy's --policy name, and the label of its decisions.
const NameRoundRobin = "round_robin"

// RoundRobin cycles through the candidates. Unavailable workers are not candidates, so they are
// skipped rather than handed a turn.
//
// Its rotation counter advances in Select (a request re-selected after a refusal takes the next
// worker); it learns nothing from outcomes.
type RoundRobin struct {
	Base
	next atomic.Uint64
}

func (*RoundRobin) Name() string { return NameRoundRobin }

func (p *RoundRobin) Select(in Input) Decision {
	n := p.next.Add(1) - 1
	return in.Pick(in.Candidates[n%uint64(len(in.Candidates))], NameRoundRobin)
}
