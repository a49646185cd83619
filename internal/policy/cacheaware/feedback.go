package cacheaware

import "github.com/cacheroute/cacheroute/internal/policy"

// A worker "evicted" what the tree counted on when it served at most half the predicted cached
// tokens, and at least minShortfallTokens fewer: block rounding and the chat template's own
// tokens make small differences ordinary.
const minShortfallTokens = 64

// Served checks the prediction of a decision against the cached tokens the worker reported.
// The prediction is the matched fraction of the routing text times the prompt's tokens. When the
// worker served far fewer, its cache has evicted the prefix the tree said it held, and with it,
// a least-recently-used cache being what it is, everything the worker last used before that
// prefix: those holds stop counting (prefixtree.Forget), so the next decisions no longer send
// conversations after them. What this request taught at Commit stays, since the worker has just
// prefilled it.
func (p *Policy) Served(in policy.Input, d policy.Decision, prompt, cached int) bool {
	if p.opts.DisableCorrection || d.Worker == nil || d.Held == 0 || d.HeldAt == 0 || prompt <= 0 {
		return false
	}
	predicted := int(d.Match * float64(prompt))
	if cached*2 > predicted || predicted-cached < minShortfallTokens {
		return false
	}
	p.tree.Forget(d.Worker.Tenant(), d.HeldAt)
	return true
}
