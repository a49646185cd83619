// Package policy chooses a worker for a request. A Policy is pure logic over the request's keys and
// the candidate workers' state; it does no I/O. This package holds the interface and the baseline
// policies (one file each); the cache-aware policy lives in policy/cacheaware.
package policy

import (
	"context"
	"math/rand/v2"

	"github.com/cacheroute/cacheroute/internal/reqkey"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Input is what a policy sees for one request.
type Input struct {
	// Context bounds any store access the policy makes (a shared session store); never nil when
	// the proxy calls.
	Context context.Context
	Request *reqkey.Request
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
	// Tokens are the request's prompt tokens as the engines render them (their /tokenize), when
	// the proxy asked for them: a chat request without session or response id, with the
	// workers' KV-cache events subscribed to. nil otherwise.
	Tokens []uint32
}

// Decision is a policy's choice and why it was made.
type Decision struct {
	Worker *workers.Worker
	// Label names the reason, echoed in x-vllm-router-decision; baseline policies use their name.
	Label string
	// Match is the predicted fraction of the request's routing text the chosen worker holds in
	// cache, or 0 when the policy does not know.
	Match float64
	// Held is how many bytes of the routing text the chosen worker held before this request, for
	// a policy to undo what Commit taught if the attempt fails. 0 when the policy does not know.
	Held int
	// HeldAge is how old, in the policy's own measure, the prefix the chosen worker held was
	// (how much the policy had taught the worker since it last used it), so that feedback can
	// tell how far back the worker's cache reaches. Meaningful only when Held > 0.
	HeldAge uint64
	// Forget are tenants the policy found gone or unavailable while choosing; Commit drops their
	// state, so that Select itself changes nothing.
	Forget []string
	// Refusal, when set, says that no worker may take the request (Worker is then nil): the
	// proxy answers it in the route's error shape, and nothing is committed.
	Refusal *Refusal
}

// Refusal is a policy's answer that the request cannot be served anywhere: a turn that continues
// a stored response whose worker is gone must not reach a worker that cannot know it.
type Refusal struct {
	Status  int    // the HTTP status: 404 when the request names what no longer exists, 503 when it is unavailable for now
	Code    string // a machine-readable code for the error body
	Message string // safe to show the client
}

// Policy chooses a worker in three steps, so that nothing is learned from a choice the proxy
// could not carry out:
//
//   - Select decides, without changing any state; the proxy may call it again (without the
//     refused worker) when the worker's breaker refuses the attempt.
//   - Commit records a decision once the proxy accepted it: the breaker granted the attempt and
//     the load is counted. Affinity state (a session map, a prefix tree) is taught only here.
//   - Observe tells how the attempt ended, so a policy can unlearn a worker that failed.
type Policy interface {
	Name() string
	Select(in Input) Decision
	Commit(in Input, d Decision)
	Observe(in Input, d Decision, o workers.Outcome)
}

// Stateless gives the policies that learn nothing their Commit and Observe.
type Stateless struct{}

func (Stateless) Commit(Input, Decision)                   {}
func (Stateless) Observe(Input, Decision, workers.Outcome) {}

// Labeled is implemented by policies whose decisions carry labels beyond the policy's name; the
// router counts those per label in cache_aware_decisions_total. The set is fixed, so metric
// series stay bounded.
type Labeled interface {
	DecisionLabels() []string
}

// WorkerRemovalListener is implemented by policies that keep per-worker state; the router calls
// it when a worker URL (all its ranks) leaves the pool.
type WorkerRemovalListener interface {
	WorkerRemoved(url string)
}

// ResponseTracker is implemented by policies that follow stored responses (the Responses API's
// previous_response_id) to the worker that produced them, which alone can continue from them.
// The proxy tells the policy every stored response it relays, and asks it where an id lives for
// the requests that name one in their path (GET, DELETE, cancel, input_items).
type ResponseTracker interface {
	// ResponseStored records that w produced the stored response id.
	ResponseStored(ctx context.Context, id string, w *workers.Worker)
	// ResponseHolder returns the tenant that produced response id, if known.
	ResponseHolder(ctx context.Context, id string) (tenant string, ok bool)
	// ResponseDeleted forgets id, once its worker deleted it.
	ResponseDeleted(ctx context.Context, id string)
}

// CacheFeedback is implemented by policies that predict what each worker holds in its prefix
// cache and can check the prediction: the proxy reports, for every answer whose usage it read,
// how many of the prompt's tokens the worker served from its cache.
type CacheFeedback interface {
	// Served reports that the worker of d served cached of the request's prompt tokens from its
	// cache. It returns whether the policy corrected its model of the worker (it had evicted
	// what the policy counted on).
	Served(in Input, d Decision, prompt, cached int) (corrected bool)
}

// LeastLoaded returns the candidate with the fewest requests in flight. Ties are broken uniformly
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
