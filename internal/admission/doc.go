// Package admission decides whether a request may start now, must wait, or is refused: per-tenant
// rate limits, concurrency limits, and a bounded queue ordered by priority with fairness across
// tenants. It is pure logic, with no HTTP in it: the proxy calls it after reading and parsing a
// request and before choosing a worker, and turns its refusals into answers.
//
// # Rate limits
//
// A Limiter holds per-tenant token buckets for requests per minute and tokens per minute:
//
//	Check(ctx, tenant, tokens) Decision  // takes 1 request and tokens when both fit, nothing otherwise
//
// tokens is the caller's estimate of the prompt plus max_tokens. The Decision carries the values
// of the OpenAI-style headers (x-ratelimit-limit-, -remaining- and -reset-requests / -tokens,
// from Requests and Tokens; a Limit of 0 means that dimension is not limited and has no
// headers) and, when the request does not fit, RetryAfter for a 429; a TooLarge request never
// fits (its tokens exceed the tenant's whole minute). MemoryLimiter is the in-process
// implementation; it keeps buckets only for the tenants it was built with, so its memory is
// bounded by the configuration, and a tenant it does not know is not limited.
//
// # Concurrency and the queue
//
// A Controller bounds the requests in flight router-wide (Options.MaxInFlight) and, through
// the Options.Ready hook, per worker:
//
//	New(Options) (*Controller, error)
//	(*Controller).Admit(ctx, Ticket{Tenant, Priority, Model}) (*Permit, error) // start now, wait, or refuse
//	(*Permit).Release()                                                   // give the place back; idempotent
//	(*Controller).Wake()                                                  // worker room appeared: offer the queue again
//
// A request that cannot start waits in a queue of at most Options.QueueSize requests. It
// leaves the queue when it is its turn and the limits allow; then Admit returns a Permit.
// Otherwise Admit returns a *Rejection:
//   - QueueFull, at once, when the queue is full and holds nothing less deserving (see below);
//   - QueueTimeout after Options.QueueTimeout;
//   - ClientGone as soon as ctx ends; the request leaves the queue at once.
//
// QueueFull becomes 429 with Retry-After (Rejection.RetryAfter), QueueTimeout 408 (the request
// did wait, and the vLLM router answers so); ClientGone has nobody to answer.
//
// The order of the queue: priority levels first (Options.Priorities, highest first, such as
// "interactive", "default", "batch"); within a level the tenants with waiting requests take
// turns, round-robin, so a flood from one tenant delays each other tenant by at most one of its
// requests per turn; within a tenant, arrival order. When the queue is full, an arrival
// displaces the newest request of the tenant with the most requests at the lowest waiting level,
// if that level is below the arrival's, or is the same and that tenant has at least two more
// requests waiting than the arrival's tenant: the displaced request is refused with QueueFull.
// So a batch flood cannot lock interactive requests out of a full queue, nor one tenant its
// peers.
//
// # The per-worker limit
//
// Admission happens before the worker is chosen, so it cannot reserve a slot on a particular
// worker. Instead the Controller counts the requests it admitted for each model and not yet
// released, and the proxy sets Options.Ready to compare that count with the room of the
// model's workers (the per-worker limit times the available workers serving it): a request
// starts only when Ready says so, and otherwise keeps its place in the queue. Counting admitted
// requests, not reading worker loads, keeps the bound exact: a request admitted a moment ago has
// not reached its worker yet, so loads would let a whole queue through at once. Ready is asked
// again whenever a Permit is released and on Wake, which the proxy calls when a worker gains
// room in another way (a worker joined or became healthy). Requests for a model whose workers
// are full do not hold up requests for other models. The bound is on the model's requests
// together; how they spread over its workers is the policy's placement. Without Ready only
// MaxInFlight applies.
//
// # Wiring
//
//	d := limiter.Check(ctx, tenant, promptEstimate+maxTokens) // headers from d.Requests, d.Tokens
//	if !d.Allowed {
//		// 429; Retry-After d.RetryAfter, or none when d.TooLarge (retrying will not help)
//	}
//	permit, err := controller.Admit(ctx, admission.Ticket{Tenant: tenant, Priority: prio, Model: model})
//	if err != nil {
//		var rej *admission.Rejection
//		switch {
//		case !errors.As(err, &rej): // ErrUnknownPriority: 400
//		case rej.Reason == admission.ClientGone: // nobody to answer
//		case rej.Reason == admission.QueueTimeout: // 408
//		default: // 429 with Retry-After rej.RetryAfter
//		}
//		return
//	}
//	defer permit.Release()
//	// select, acquire the worker, forward; close the attempt before the deferred Release
//
// A rate-limited request is refused before it queues, so it costs no queue place. Tokens taken
// by Check are not given back if the queue later refuses the request.
//
// # Guarantees
//
// Every Permit counts once however often Release is called, and InFlight and Queued return to
// 0 when every request is over. A waiting request costs its caller's goroutine and a timer,
// nothing else; tenants leave the queue's state with their last waiting request. Options.Reporter
// receives queue lengths by priority, wait times and rejections by reason; the metrics package
// implements it.
package admission
