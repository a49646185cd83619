package cacheaware

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/reqkey"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// The labels of a Responses turn that continues a stored response (previous_response_id). They
// come before every other step, the balance gate included: the worker that stored a response is
// the only one that can continue from it, so no other worker is ever an option.
const (
	LabelResponseMatch       = "response_id_match"       // the worker that stored the previous response takes the turn
	LabelResponseGone        = "response_id_gone"        // that worker left the fleet: 404 at once, no worker asked
	LabelResponseUnavailable = "response_id_unavailable" // that worker is registered but cannot take requests now: 503
)

// responseLabels are the labels followResponse gives.
var responseLabels = []string{LabelResponseMatch, LabelResponseGone, LabelResponseUnavailable}

// responseNamespace is the session store's model namespace of response ids. Ids are not per
// model (GET /v1/responses/{id} names none), and no served model is called "".
const responseNamespace = ""

// producedBy marks the value of a response entry, the ID of the worker that produced it. Marked,
// it names no worker: removing a worker drops the session entries that point at it, but a response
// entry must outlive its worker: a turn that continues a removed worker's response is then
// answered response_id_gone at once, rather than sent to a worker that cannot know the id. The
// entry ends with its TTL like any other.
const producedBy = "response-of:"

// responseKey is the store key of a response id: the id itself, or a fixed-size hash of an id
// longer than reqkey.MaxIDLen.
func responseKey(id string) string {
	if len(id) <= reqkey.MaxIDLen {
		return "response:" + id
	}
	sum := sha256.Sum256([]byte(id))
	return "response:sha256:" + hex.EncodeToString(sum[:16])
}

// ResponseStored records that w produced the stored response id, for the session TTL.
func (p *Policy) ResponseStored(ctx context.Context, id string, w *workers.Worker) {
	_ = p.store.Set(ctx, responseNamespace, responseKey(id), producedBy+w.ID())
}

// ResponseHolder returns the worker that produced response id, if the store knows it.
func (p *Policy) ResponseHolder(ctx context.Context, id string) (tenant.ID, bool) {
	v, ok, err := p.store.Get(ctx, responseNamespace, responseKey(id))
	if err != nil || !ok {
		return "", false
	}
	worker, ok := strings.CutPrefix(string(v), producedBy)
	return tenant.ID(worker), ok
}

// ResponseDeleted forgets response id.
func (p *Policy) ResponseDeleted(ctx context.Context, id string) {
	_ = p.store.Delete(ctx, responseNamespace, responseKey(id))
}

// followResponse places a turn that continues the stored response id: on the worker that
// produced it when that worker is a candidate; refused when it is not. ok is false when the id
// is unknown (never seen, or its entry expired): the rest of the chain then places the turn by
// its session key or its load, and the worker that takes it answers for the id itself.
func (p *Policy) followResponse(d *decision, id string) (dec policy.Decision, ok bool) {
	tenant, ok := p.ResponseHolder(d.ctx, id)
	if !ok {
		return dec, false
	}
	if w := candidate(d.in.Candidates, tenant); w != nil {
		return policy.Decision{Worker: w, Label: LabelResponseMatch}, true
	}
	shown := id
	if len(shown) > 200 {
		shown = shown[:200] + "…"
	}
	if candidate(d.in.All, tenant) == nil {
		return policy.Decision{Label: LabelResponseGone, Refusal: &policy.Refusal{Status: 404, Code: "response_not_found",
			Message: "Response with id '" + shown + "' not found: the worker that stored it has left the fleet."}}, true
	}
	return policy.Decision{Label: LabelResponseUnavailable, Refusal: &policy.Refusal{Status: 503, Code: "response_worker_unavailable",
		Message: "the worker that stored response '" + shown + "' cannot take requests now; try again shortly"}}, true
}
