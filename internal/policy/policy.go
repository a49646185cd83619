// Package policy chooses a worker for a request. A Policy is pure logic over the request's keys and
// the candidate workers' state; it does no I/O. This package holds the contract every policy
// follows, the factories that build a policy by name (Register, New; names and knobs are in
// policy/registry), and the baseline policies (one file each); the cache-aware policy lives in
// policy/cacheaware.
//
// # The contract
//
// The proxy drives every policy through the same hooks, in this order, and never asks a policy
// what it can do: a hook a policy has no use for is inherited from Base and does nothing.
//
//   - Select(in) decides without changing any state; the proxy may call it again (without the
//     refused worker) when the worker's breaker refuses the attempt. What the policy needs to
//     remember about its choice goes in Decision.State, which only the policy reads. A policy
//     that admits sessions by KV room may answer a Hold instead of a worker: the proxy waits
//     where the Hold says, then asks Select again (Input.Held, Input.HoldOver).
//   - Accepted(in, d) says the proxy accepted the decision (the breaker granted the attempt and
//     the load is counted): affinity state (a session map, a prefix tree) is taught only here.
//   - FirstByte(in, d, ttft) says the answer's first byte came, ttft after the attempt was sent:
//     a streamed answer's time to first token (a non-streamed answer's first byte is its end, and
//     is not told).
//   - Done(in, d, outcome, usage) says how the attempt ended, with the prompt, output and cached
//     tokens the worker reported when its answer said: with FirstByte, the only way a policy
//     learns from results.
//   - WorkerAdded(url) and WorkerRemoved(url) follow the fleet; Run(ctx) runs the policy's
//     background loop (a sweep) until ctx ends; Labels, Responses and State describe the policy
//     to the router (decision labels to count, the map of stored responses, state sizes).
//
// # Writing a policy
//
// A policy is a type that embeds Base and implements Name and Select, registered by name with a
// factory from its package's init; --policy, the bench and the demo then find it:
//
//	// LeastBusy sends each request to the least-loaded candidate.
//	type LeastBusy struct{ policy.Base }
//
//	func (LeastBusy) Name() string { return "least_busy" }
//
//	func (LeastBusy) Select(in policy.Input) policy.Decision {
//		return in.Pick(policy.LeastLoaded(in.Candidates), "least_busy")
//	}
//
//	func init() {
//		policy.Register(policy.Entry{
//			Spec: registry.Spec{Name: "least_busy", Summary: "the least-loaded candidate"},
//			New:  func(policy.Env, registry.Options) policy.Policy { return LeastBusy{} },
//		})
//	}
//
// Input carries what every policy needs of a request; what one policy needs beyond it, it reaches
// through the Env it was built with: a policy that matches requests against the workers' KV-cache
// events asks for a request's prompt tokens in Select (Input.PromptTokens with Env.Tokenizer),
// which costs a /tokenize round trip, for the requests worth it.
//
// A policy that learns overrides Accepted and Done, keeping what it must remember of a choice in
// Decision.State; one with a background sweep overrides Run; one that follows stored responses
// returns its map from Responses. A policy with knobs gives Spec.Options, its options at their
// defaults: they bind their own flags and validate their own values (registry.Options), so that
// internal/config binds and checks them without knowing the policy, and the factory gets them
// back resolved. The proxy and the router call every hook of every policy, so a new policy needs
// no change outside its own package and its import by the router.
package policy

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/protocol"
	"github.com/cacheroute/cacheroute/internal/reqkey"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Input is what a policy sees for one request.
type Input struct {
	// Context bounds any store access the policy makes (a shared session store); never nil when
	// the proxy calls.
	Context context.Context
	Request *protocol.Request
	// Model names the state the request belongs to: the served model the request asked for, as a
	// worker listed it, or "" when the fleet's workers list no models. Never the client's string
	// unchecked, so a client cannot create state for models nobody serves.
	Model string
	// Candidates are the tenants that may take the request (healthy, breaker closed, serving the
	// model, not yet tried for this request). Never empty.
	Candidates []*workers.Worker
	// All is every registered tenant, candidate or not, for policies whose mapping must not move
	// when a worker is briefly unavailable (the hash ring).
	All []*workers.Worker
	// Path is the route's path (/v1/chat/completions ...): the scope a tokenizer keeps a
	// request's tokens under, as the APIs' prompts may render apart.
	Path string
	// Body is the request body, the bytes Request was parsed from: a tokenizer renders its query
	// from them. It is the server's memory for the request and does not outlive it: a policy reads
	// it within the hook it is given to, and keeps no reference to it.
	Body []byte
	// Prompt is the request's memo of its prompt tokens, made by the proxy per request, so that a
	// request Selected again (a retry, after a Hold, its prefill leg) is tokenized at most once
	// (PromptTokens). nil: each PromptTokens asks anew.
	Prompt *PromptMemo
	// Size is the request body's length in bytes: the prompt's size when the request has no
	// routing text.
	Size int
	// Held says the request has waited for KV room (a Decision.Hold) at least once; HoldOver says
	// it may wait no more (its wait's deadline passed, or the queue of waiting requests was full):
	// the policy places it now.
	Held, HoldOver bool
}

// PrefillTokens estimates the prompt tokens a worker that holds held bytes of the request's
// routing text must still compute: the routing text (or, without one, the body) less what it
// holds, at reqkey.BytesPerToken.
func (in Input) PrefillTokens(held int) int {
	size := in.Size
	if req := in.Request; req != nil && req.Text != "" {
		size = len(req.Text)
	}
	return max(size-held, 0) / reqkey.BytesPerToken
}

// Pick is the decision for w with label, for a policy that predicts nothing about w's cache.
func (in Input) Pick(w *workers.Worker, label string) Decision {
	return Decision{Worker: w, Label: label, Prefill: in.PrefillTokens(0)}
}

// Decision is a policy's choice and why it was made.
type Decision struct {
	Worker *workers.Worker
	// Label names the reason, echoed in x-vllm-router-decision; baseline policies use their name.
	Label string
	// Match is the predicted fraction of the request's prompt the chosen worker holds in cache,
	// or 0 when the policy does not know.
	Match float64
	// Prefill is the prompt tokens the chosen worker is expected to compute (Input.PrefillTokens):
	// the tokens load signal weighs the attempt by it until the answer's first byte.
	Prefill int
	// TTFT is the time to first token the policy predicts on the chosen worker, or 0 when it
	// predicts none; the router sets it beside the achieved one.
	TTFT time.Duration
	// State is the policy's own record of the choice, handed back to it in Accepted and Done;
	// nothing else reads it.
	State any
	// Refusal, when set, says that no worker may take the request (Worker is then nil): the
	// proxy answers it in the route's error shape, and nothing is accepted.
	Refusal *Refusal
	// Hold, when set, says that no worker has KV room for the request's session now (Worker is
	// then nil): the proxy waits in Hold.Queue, then asks Select again.
	Hold *Hold
}

// Hold is a policy's answer that the request should wait for KV room: placed now, its session's
// working set would make an engine evict the cache of a session that is coming back.
type Hold struct {
	// Queue is where requests wait their turn (least attained service first).
	Queue *admission.SessionQueue
	// Need is the working set the request brings, in tokens; Served the prompt tokens its session
	// was served so far.
	Need   int
	Served int64
}

// PredictedCached is the prompt tokens the decision predicts the worker serves from its cache,
// of a prompt of prompt tokens.
func (d Decision) PredictedCached(prompt int) float64 { return d.Match * float64(prompt) }

// Refusal is a policy's answer that the request cannot be served anywhere: a turn that continues
// a stored response whose worker is gone must not reach a worker that cannot know it.
type Refusal struct {
	Status  int    // the HTTP status: 404 when the request names what no longer exists, 503 when it is unavailable for now
	Code    string // a machine-readable code for the error body
	Message string // safe to show the client
}

// Usage is what a worker's answer said about its tokens: the prompt's, how many of them the worker
// served from its prefix cache, and the output's. Known says the answer reported the prompt and
// what was cached (vLLM reports cached tokens only with --enable-prompt-tokens-details); Prompt
// and Output may be set without it. A failure, or an answer without usage, reports nothing.
type Usage struct {
	Known                  bool
	Prompt, Cached, Output int
}

// Policy is the contract every policy follows; see the package doc for the order of the hooks.
type Policy interface {
	// Name is the policy's --policy name, as registered.
	Name() string
	// Labels lists every decision label the policy gives beyond its name; the router counts
	// decisions per label in cache_aware_decisions_total. The set is fixed, so metric series
	// stay bounded. nil: the policy labels its decisions with its name only.
	Labels() []string
	// Select chooses a worker among in.Candidates, changing no state.
	Select(in Input) Decision
	// Accepted records a decision the proxy carried out.
	Accepted(in Input, d Decision)
	// FirstByte tells that a streamed answer's first byte came ttft after its attempt was sent.
	FirstByte(in Input, d Decision, ttft time.Duration)
	// Done tells how the attempt of an accepted decision ended, with what the answer reported.
	// It returns whether the policy corrected its model of the worker from u (the worker had
	// evicted what the policy counted on).
	Done(in Input, d Decision, o workers.Outcome, u Usage) (corrected bool)
	// WorkerAdded and WorkerRemoved follow the fleet by worker URL (all its ranks), in the
	// normalised form the pool uses (tenant.NormalizeURL).
	WorkerAdded(url string)
	WorkerRemoved(url string)
	// Run runs the policy's background work until ctx ends; it returns at once when there is
	// none.
	Run(ctx context.Context)
	// Responses is the policy's map of stored responses, or nil when it follows none.
	Responses() ResponseStore
	// State reports the sizes of the policy's affinity state at scrape time, or nil when it
	// keeps none.
	State() State
}

// Base gives a policy every hook but Name and Select, each doing nothing: embed it and override
// what the policy uses.
type Base struct{}

func (Base) Labels() []string { return nil }

func (Base) Accepted(Input, Decision)                          {}
func (Base) FirstByte(Input, Decision, time.Duration)          {}
func (Base) Done(Input, Decision, workers.Outcome, Usage) bool { return false }
func (Base) WorkerAdded(string)                                {}
func (Base) WorkerRemoved(string)                              {}
func (Base) Run(context.Context)                               {}
func (Base) Responses() ResponseStore                          { return nil }
func (Base) State() State                                      { return nil }

// ResponseStore follows stored responses (the Responses API's previous_response_id) to the
// worker that produced them, which alone can continue from them. The proxy tells it every stored
// response it relays, and asks it where an id lives for the requests that name one in their path
// (GET, DELETE, cancel, input_items).
type ResponseStore interface {
	// ResponseStored records that w produced the stored response id.
	ResponseStored(ctx context.Context, id string, w *workers.Worker)
	// ResponseHolder returns the worker that produced response id, if known.
	ResponseHolder(ctx context.Context, id string) (worker tenant.ID, ok bool)
	// ResponseDeleted forgets id, once its worker deleted it.
	ResponseDeleted(ctx context.Context, id string)
}

// State is the size of a policy's affinity state, read at scrape time.
type State interface {
	TreeBytes() int
	TreeChars() int
	// Sessions is the session count per model, or nil when the store cannot count.
	Sessions() map[string]int
}

// LeastLoaded returns the candidate with the least load (Worker.Load). Ties are broken uniformly
// at random (reservoir sampling over the tied), never by position: picking the first of equals
// would send every request of an idle fleet to the same worker.
func LeastLoaded(candidates []*workers.Worker) *workers.Worker {
	var best *workers.Worker
	var bestLoad int64
	ties := 0
	for _, w := range candidates {
		load := w.Load()
		switch {
		case best == nil || load < bestLoad:
			best, bestLoad, ties = w, load, 1
		case load == bestLoad:
			ties++
			if rand.IntN(ties) == 0 {
				best = w
			}
		}
	}
	return best
}
