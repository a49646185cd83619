package cacheaware

import "github.com/cacheroute/cacheroute/internal/policy"

// A worker "evicted" what the tree counted on when it served at most half the predicted cached
// tokens, and at least minShortfallTokens fewer; it "kept more" when it served at least
// minShortfallTokens more. Block rounding and the chat template's own tokens make smaller
// differences ordinary.
const minShortfallTokens = 64

// served checks the prediction of a decision against the cached tokens the worker reported. The
// prediction is the matched fraction of the routing text times the prompt's tokens.
//
// The tree models each worker's cache as vLLM's evicts, least recently used first and a
// request's tail before its head, its holds aging by the text taught to that worker since
// (prefixtree.Reach). When the worker served far fewer tokens than predicted, its cache no
// longer reaches back to the first byte it lost (estimated from the share of the prediction it
// served): holds that old stop counting for that worker, now and as later ones age
// (prefixtree.Evicted), so the next decisions no longer follow them. When it served notably
// more, its cache reaches further than the tree's horizon said, which grows (prefixtree.Kept).
// What this request taught at Accepted stays counted: the worker has just prefilled it.
func (p *Policy) served(in policy.Input, d policy.Decision, prompt, cached int) bool {
	if p.opts.DisableCorrection || d.Worker == nil || prompt <= 0 {
		return false
	}
	c := choiceOf(d)
	predicted := 0
	if c.held > 0 {
		predicted = int(d.Match * float64(prompt))
	}
	switch {
	case c.held > 0 && cached*2 <= predicted && predicted-cached >= minShortfallTokens:
		// The cache kept the first cached/predicted of the held bytes; the first byte it lost
		// is as much younger than the deepest held one as it sits above it. A cache holds at
		// least the request it has just run, so the horizon stays above this request's text.
		lost := uint64(float64(c.held) * (1 - float64(cached)/float64(predicted)))
		horizon := max(c.heldAge-min(lost, c.heldAge), uint64(len(newDecision(in).text))+1)
		p.tree.Evicted(d.Worker.ID(), horizon)
		return true
	case cached-predicted >= minShortfallTokens:
		p.tree.Kept(d.Worker.ID())
	}
	return false
}
