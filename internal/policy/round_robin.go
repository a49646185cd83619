package policy

import "sync/atomic"

// RoundRobin cycles through the candidates. Unavailable workers are not candidates, so they are
// skipped rather than handed a turn.
//
// Its rotation counter advances in Select (a request re-selected after a refusal takes the next
// worker); it learns nothing from outcomes.
type RoundRobin struct {
	Stateless
	next atomic.Uint64
}

func (*RoundRobin) Name() string { return "round_robin" }

func (p *RoundRobin) Select(in Input) Decision {
	n := p.next.Add(1) - 1
	return Decision{Worker: in.Candidates[n%uint64(len(in.Candidates))], Label: "round_robin"}
}
