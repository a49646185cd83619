package cacheaware

import (
	"slices"

	"github.com/cacheroute/cacheroute/internal/prefixtree"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// chain.go is the decision chain: a table of named steps tried in order, the first that decides
// choosing the worker and the label. Every step reads the prefix tree through the decision's one
// probe of it (decision.probe), so a decision walks the tree once whatever steps it tries.

// step is one link of the chain: one function with one job.
type step struct {
	// name says why the step decides. A label is a public metric and keeps its value, so one
	// label may be given for several reasons (low_match_min_load: no engine holds any of the
	// prompt, no text to match, too little cached, load outweighed the cache); each reason is a
	// step of its own, and the decision's debug log names it.
	name string
	// labels are every label the step can give; Labels is derived from them.
	labels []string
	// fn is the step's function (run).
	fn stepFunc
	// family, for a history step, is the family of requests it places and whose labels it gives;
	// the step does not apply to the other family's requests.
	family *history
}

// stepFunc names the function of a step, which run calls: the decision would escape to the heap
// if the table held the functions themselves, as the compiler cannot follow an indirect call.
type stepFunc uint8

const (
	balanceGate stepFunc = iota
	followEvictedSession
	followSession
	placeByEvents
	noEngineHoldsAny
	emptyHistory
	noText
	continued
	tooLittleCached
	holdersGone
	byCostMode
	byLoad
)

// run calls the function of s: the worker and label it chose, or ok false when it does not apply.
func (p *Policy) run(s *step, d *decision) (w *workers.Worker, label string, ok bool) {
	if h := s.family; h != nil {
		if (d.key != "") != h.session {
			return nil, "", false
		}
		switch s.fn {
		case continued:
			return p.continued(d, h)
		case tooLittleCached:
			return p.tooLittleCached(d, h)
		case holdersGone:
			return p.holdersGone(d, h)
		case byCostMode:
			return p.byCostMode(d, h)
		case byLoad:
			return p.byLoad(d, h)
		}
	}
	switch s.fn {
	case balanceGate:
		return p.balanceGate(d)
	case followEvictedSession:
		return p.followEvictedSession(d)
	case followSession:
		return p.followSession(d)
	case placeByEvents:
		return p.placeByEvents(d)
	case noEngineHoldsAny:
		return p.noEngineHoldsAny(d)
	case emptyHistory:
		return p.emptyHistory(d)
	case noText:
		return p.noText(d)
	}
	panic("cacheaware: a step without a function")
}

// chain is the decision chain in order (docs/cache-aware.md, "The decision chain"). Its last step
// decides every request that reaches it.
var chain = slices.Concat([]step{
	{name: "balance_gate", labels: []string{LabelLoadBalance}, fn: balanceGate},
	{name: "session_evicted", labels: []string{LabelSessionEvicted}, fn: followEvictedSession},
	{name: "session_map", labels: []string{LabelSessionMatch}, fn: followSession},
	{name: "kv_events", labels: []string{LabelKVEventsMatch}, fn: placeByEvents},
	{name: "no_engine_holds_any", labels: []string{LabelLowMatch}, fn: noEngineHoldsAny},
	{name: "empty_history", labels: []string{LabelEmptyHistory}, fn: emptyHistory},
	{name: "no_text", labels: []string{LabelLowMatch}, fn: noText},
}, historySteps(&sessionHistory), historySteps(&textHistory))

// labels are every label the policy gives, derived from what each path declares: the turns that
// continue a stored response, the chain, and the pressure-aware placement.
var labels = func() []string {
	var all []string
	add := func(ls ...string) {
		for _, l := range ls {
			if !slices.Contains(all, l) {
				all = append(all, l)
			}
		}
	}
	add(responseLabels...)
	for _, s := range chain {
		add(s.labels...)
	}
	add(pressureLabels...)
	return all
}()

// choose runs the chain: the worker, the label and the name of the step that decided.
func (p *Policy) choose(d *decision) (*workers.Worker, string, string) {
	for i := range chain {
		if w, label, ok := p.run(&chain[i], d); ok {
			return w, label, chain[i].name
		}
	}
	panic("cacheaware: the chain's last step decides every request")
}

// balanceGate: imbalance overrides every affinity. The least-loaded candidate, the one holding
// the longest prefix of the text among equals.
func (p *Policy) balanceGate(d *decision) (*workers.Worker, string, bool) {
	if !p.imbalanced(d.minLoad, d.maxLoad) {
		return nil, "", false
	}
	return p.leastLoadedByMatch(d), LabelLoadBalance, true
}

// sessionWorker is the candidate the session map names for d's session, looked up once per
// decision; nil when the request has no session key, the map knows none, or it names a worker
// that is not a candidate (a stale entry needs no deleting: Accepted points the session at the
// new worker).
func (p *Policy) sessionWorker(d *decision) *workers.Worker {
	if !d.sessionLooked {
		d.sessionLooked = true
		if d.key != "" {
			if worker, ok, err := p.store.Get(d.ctx, d.model, d.key); err == nil && ok {
				d.session = candidate(d.in.Candidates, worker)
			}
		}
	}
	return d.session
}

// followEvictedSession: the events show the session's worker's engine holding none of the
// session. The tree holds its text on that worker alone, which the events contradict: the events
// place it, as a request without session key, else the least loaded.
func (p *Policy) followEvictedSession(d *decision) (*workers.Worker, string, bool) {
	w := p.sessionWorker(d)
	if w == nil || !p.sessionEvicted(d, w) {
		return nil, "", false
	}
	if w, ok := p.byEvents(d); ok {
		return w, LabelSessionEvicted, true
	}
	return p.minLoad(d), LabelSessionEvicted, true
}

// followSession: the session map names a candidate, which takes the request even if busier (the
// gate did not trip).
func (p *Policy) followSession(d *decision) (*workers.Worker, string, bool) {
	w := p.sessionWorker(d)
	return w, LabelSessionMatch, w != nil
}

// placeByEvents: a request that came with its tokens goes where the engines report holding
// most of it for its load (byEvents), unless the tree alone is asked (IndexText). A session the
// map does not know (its first turn here, or placed by a replica that shares no session store)
// is placed so too, as a request without session key.
func (p *Policy) placeByEvents(d *decision) (*workers.Worker, string, bool) {
	if p.opts.CacheIndex == IndexText {
		return nil, "", false
	}
	w, ok := p.byEvents(d)
	return w, LabelKVEventsMatch, ok
}

// noEngineHoldsAny: with the events alone (IndexEvents), a request without session key that came
// with its tokens, which no engine holds any of: the least loaded.
func (p *Policy) noEngineHoldsAny(d *decision) (*workers.Worker, string, bool) {
	if d.key != "" || p.opts.CacheIndex != IndexEvents || p.opts.KVIndex == nil || len(d.prompt.Tokens) == 0 {
		return nil, "", false
	}
	return p.minLoad(d), LabelLowMatch, true
}

// emptyHistory: a session the map does not know, with no text to match: the least loaded.
func (p *Policy) emptyHistory(d *decision) (*workers.Worker, string, bool) {
	if d.key == "" || d.text != "" {
		return nil, "", false
	}
	return p.minLoad(d), LabelEmptyHistory, true
}

// noText: a request without session key and no text to match: the least loaded.
func (p *Policy) noText(d *decision) (*workers.Worker, string, bool) {
	if d.key != "" || d.text != "" {
		return nil, "", false
	}
	return p.minLoad(d), LabelLowMatch, true
}

// history is one family of the steps that place a request by the tree's match of its text: the
// family of a chat with a session key the map does not know (session), or that of a request
// without any. The steps are the same; their labels are the family's.
type history struct {
	name            string // the family's steps' names begin with it
	session         bool
	hit, stale, low string // the match decided; its holders are gone; the load decided
}

var (
	sessionHistory = history{"session_history", true, LabelFullHistoryMatch, LabelStaleTenant, LabelHistoryLowMatch}
	textHistory    = history{"text", false, LabelCacheAffinity, LabelFirstHealthyFallback, LabelLowMatch}
)

// historySteps are the history steps of family h, in order. The steps before them placed every
// request without text, so these always have some.
//
// Above the threshold, a match that continues one conversation (the previous turns of this
// conversation, or the same request again) sends the request to the least loaded of the
// candidates holding it: anywhere else the whole history would be prefilled again.
//
// Any other match is only worth the prefill it saves: a prefix several conversations share (a
// common system prompt and tool schemas) is worth one prefill per worker, and a match below the
// threshold may still be a long document. In the cost mode (the default) each candidate costs
// its load plus the prefill it would do, in units of LoadUnitTokens (byCost), so a holder wins
// while it is not busier than its saving is worth. In the threshold mode a match below the
// threshold goes to the least-loaded candidate, and a shared prefix to the least-loaded
// candidate, a holder among equally loaded ones. Either way, piling every new conversation onto
// the first worker that saw its system prompt would leave the rest of the fleet idle while that
// worker's cache thrashes.
//
// When no holder of the deciding match is a candidate, the holders that are gone or unavailable
// are removed from the tree and the least-loaded candidate takes the request.
func historySteps(h *history) []step {
	return []step{
		{name: h.name + "_continued", labels: []string{h.hit, h.stale}, fn: continued, family: h},
		{name: h.name + "_too_little_cached", labels: []string{h.low}, fn: tooLittleCached, family: h},
		{name: h.name + "_holders_gone", labels: []string{h.stale}, fn: holdersGone, family: h},
		{name: h.name + "_by_cost", labels: []string{h.hit, h.low}, fn: byCostMode, family: h},
		{name: h.name + "_by_load", labels: []string{h.hit, h.low}, fn: byLoad, family: h},
	}
}

// continued: the match continues one conversation (continuation). The least loaded of its
// holders among the candidates; stale when none is a candidate.
func (p *Policy) continued(d *decision, h *history) (*workers.Worker, string, bool) {
	conversation := p.continuation(d)
	if conversation == nil {
		return nil, "", false
	}
	if holders := p.candidateHolders(d, conversation); len(holders) > 0 {
		return p.leastLoaded(d, holders), h.hit, true
	}
	return p.minLoad(d), h.stale, true
}

// tooLittleCached: nothing matches, or (threshold mode) too little: the least loaded.
func (p *Policy) tooLittleCached(d *decision, h *history) (*workers.Worker, string, bool) {
	if m := d.probe.Matched; p.above(d, m) || (p.costMode() && m > 0) {
		return nil, "", false
	}
	return p.minLoad(d), h.low, true
}

// holdersGone: no holder of the match is a candidate: the least loaded.
func (p *Policy) holdersGone(d *decision, h *history) (*workers.Worker, string, bool) {
	var names [16]tenant.ID
	if len(p.candidateHolders(d, d.probe.Holders(names[:0]))) > 0 {
		return nil, "", false
	}
	return p.minLoad(d), h.stale, true
}

// byCostMode: in the cost mode, the candidate of least cost (byCost).
func (p *Policy) byCostMode(d *decision, h *history) (*workers.Worker, string, bool) {
	if !p.costMode() {
		return nil, "", false
	}
	w, label := p.byCost(d, h.hit, h.low)
	return w, label, true
}

// byLoad: in the threshold mode, a match above the threshold that is only a shared prefix. The
// least-loaded candidate; among equally loaded ones, a holder of that prefix.
func (p *Policy) byLoad(d *decision, h *history) (*workers.Worker, string, bool) {
	var names [16]tenant.ID
	holders := p.candidateHolders(d, d.probe.Holders(names[:0]))
	tied := lowest(d.in.Candidates, func(w *workers.Worker) int64 { return w.Load() })
	var tiedHolders []*workers.Worker
	for _, w := range tied {
		if slices.Contains(holders, w) {
			tiedHolders = append(tiedHolders, w)
		}
	}
	if len(tiedHolders) > 0 {
		return p.leastLoaded(d, tiedHolders), h.hit, true
	}
	return p.leastLoaded(d, tied), h.low, true
}

// costMode reports whether a match that is no continuation, or is below the threshold, is
// weighed by the prefill it saves (HistoryCost) rather than ignored.
func (p *Policy) costMode() bool { return p.opts.HistoryMatchMode != HistoryThreshold }

// above reports whether n bytes are more of d's text than the threshold.
func (p *Policy) above(d *decision, n int) bool {
	return float64(n)/float64(len(d.text)) > p.opts.CacheThreshold
}

// continuation returns the holders of the conversation the request continues, by the tree: a
// whole earlier request is a prefix of this one, or the match runs well past the last point where
// the tree's conversations diverge; nil when it continues none. A whole earlier request is
// followed to wherever it was sent, even if that worker has since lost part of it (its horizon):
// it is this conversation's own past, and no other worker holds more of it.
func (p *Policy) continuation(d *decision) []tenant.ID {
	switch {
	case p.above(d, d.probe.Whole):
		return d.probe.WholeHolders(nil)
	case p.above(d, d.probe.Matched-d.probe.Branch):
		return d.probe.Holders(nil)
	}
	return nil
}

// byCost chooses the candidate with the least cost: its load, in units of LoadUnitTokens, plus
// the text it would prefill (the part it does not hold), in the same units. Among equal costs
// the one holding more of the text wins, then as leastLoaded. The choice gets the hit label
// when the chosen worker holds the longest match among the candidates (its cache decided),
// else the low label (its load did).
func (p *Policy) byCost(d *decision, hit, low string) (*workers.Worker, string) {
	heldBy := func(w *workers.Worker) int { return d.probe.Of(w.ID()).Held / blockBytes * blockBytes }
	unit := int64(p.opts.LoadUnitTokens) * bytesPerToken
	cost := func(w *workers.Worker) int64 { return w.Load()*unit + int64(len(d.text)-heldBy(w)) }
	tied := lowest(d.in.Candidates, cost)
	if len(tied) > 1 {
		tied = lowest(tied, func(w *workers.Worker) int64 { return -int64(heldBy(w)) })
	}
	w := p.leastLoaded(d, tied)
	longest := 0
	for _, c := range d.in.Candidates {
		longest = max(longest, heldBy(c))
	}
	if held := heldBy(w); held > 0 && held == longest {
		return w, hit
	}
	return w, low
}

// candidateHolders returns the candidates among tenants, and marks the tenants that are gone or
// unavailable to be removed from the tree at Accepted. A live tenant that is not a candidate for
// this request (already tried, or not serving its model) keeps its place.
func (p *Policy) candidateHolders(d *decision, tenants []tenant.ID) []*workers.Worker {
	var holders []*workers.Worker
	for _, id := range tenants {
		if w := candidate(d.in.Candidates, id); w != nil {
			holders = append(holders, w)
		} else if !live(d.in.All, id) && !slices.Contains(d.forget, id) {
			d.forget = append(d.forget, id)
		}
	}
	return holders
}

// probe reads the tree once for d: what each step needs of the request's text. In a fleet of
// more tenants than a probe keeps inside itself, the probe borrows an array from spares for the
// rest (d.spare), which lendBack returns once the decision is made, so that it allocates none.
func (p *Policy) probe(d *decision) {
	if d.text == "" {
		return
	}
	var spare []prefixtree.Hold
	if len(d.in.All) > prefixtree.ProbeInline {
		if s, ok := p.spares.Get().(*[]prefixtree.Hold); ok {
			d.spare, spare = s, *s
		} else {
			d.spare = new([]prefixtree.Hold)
		}
	}
	p.tree.Probe(&d.probe, d.model, d.text, spare)
}

// lendBack returns the array d's probe borrowed, or the larger one it spilled to instead.
func (p *Policy) lendBack(d *decision) {
	if d.spare == nil {
		return
	}
	if spill := d.probe.Spill(); cap(spill) > cap(*d.spare) {
		*d.spare = spill[:0]
	}
	p.spares.Put(d.spare)
}
