package cacheaware

import (
	"math"
	"sync/atomic"
	"time"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/predict"
	"github.com/cacheroute/cacheroute/internal/residency"
	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// pressure.go places sessions by what the workers' KV caches can hold. It runs for the requests
// with a session key once some candidate's KV capacity is known (its engine's page, or
// --kv-capacity-tokens), in place of the balance gate and the session lookup of the chain:
//
//   - A session whose cache is resident on its worker (residency: no event said it was evicted,
//     and the working sets its worker served since fit the worker's capacity) stays there, unless
//     another worker with room would give it its first token sooner even after computing its
//     whole prompt again (session_moved): both are predicted times to first token (predict), in
//     one unit, so a queue and a prefill are weighed alike.
//   - Any other (a new session, one whose cache is gone, one whose worker left) is placed as a
//     new session: on the worker with room for its working set (its prompt) that predicts it the
//     earliest first token, among the workers with at most one live session more than the
//     fewest: a prefix that other sessions share (a common system prompt and tools) is worth one
//     prefill on each worker, not every new session on the first worker that computed it; among
//     equals, the worker with the fewest live sessions, so sessions spread over an idle fleet
//     (kv_room). A session placed and not yet accepted counts as live (claims.go). No worker
//     with room: the request waits for room (a Hold, when session admission is on), and is
//     placed when room appears (kv_room_after_wait) or when its wait is over
//     (kv_room_exhausted: the engines will evict to make room).

// Labels of the pressure-aware placement.
const (
	LabelSessionMoved    = "session_moved"      // a resident session moved: another worker, with room, gives its first token sooner even computing it all again
	LabelKVRoom          = "kv_room"            // a session placed anew on the worker with room for its working set that predicts the earliest first token
	LabelKVRoomWaited    = "kv_room_after_wait" // as kv_room, after waiting for room
	LabelKVRoomExhausted = "kv_room_exhausted"  // no worker had room and the request may wait no more: the earliest first token
)

// pressureLabels are the labels place gives: the pressure model's own, and the chain's labels of a
// session followed to its worker (session_id_match) and of one whose cache is gone from it
// (session_evicted).
var pressureLabels = []string{LabelSessionMatch, LabelSessionEvicted, LabelSessionMoved, LabelKVRoom, LabelKVRoomWaited, LabelKVRoomExhausted}

// spread is how many live sessions more than the fewest a worker may hold and still take a new
// session: enough for a session's sub-agents and a second session to share a warm prefix, few
// enough that sessions spread over an idle fleet.
const spread = 1

// moveMargin is how much sooner another worker must predict a resident session's first token
// for the session to move: a move computes the whole prompt again and leaves a copy behind, so a
// near tie stays.
const moveMargin = 0.75

// pressure is the policy's model of the workers' KV room: the sessions' working sets, the
// workers' predicted times to first token, and the queue of sessions waiting for room.
type pressure struct {
	res   *residency.Tracker
	ttft  *predict.Model
	queue *admission.SessionQueue // nil: session admission off
	// claims are the new sessions placed and not yet accepted, which count as live on their
	// workers (claims.go).
	claims *claims
	// bytesPerToken is the request bytes a prompt token takes, learned from the answers' usage,
	// as float64 bits: the estimate of a prompt's tokens when the request came without them.
	bytesPerToken atomic.Uint64
}

// PressureOptions configure the pressure-aware placement (Options.Pressure).
type PressureOptions struct {
	// Residency configures the working-set model; its MaxSessions is the policy's.
	Residency residency.Options
	// Admission turns session admission on: a session no worker has room for waits, at most
	// AdmissionTimeout, with at most AdmissionQueue others.
	Admission        bool
	AdmissionTimeout time.Duration
	AdmissionQueue   int
}

func newPressure(o PressureOptions) *pressure {
	res := residency.New(o.Residency)
	pr := &pressure{res: res, ttft: predict.New(), claims: newClaims(res.Options().Now)}
	pr.bytesPerToken.Store(math.Float64bits(bytesPerToken))
	if o.Admission {
		pr.queue = admission.NewSessionQueue(admission.SessionQueueOptions{Max: o.AdmissionQueue,
			Timeout: o.AdmissionTimeout, Fits: pr.res.Fits})
	}
	return pr
}

// sessionRecord is what the pressure model remembers of a decision (in choice).
type sessionRecord struct {
	key     string        // the session's key in the residency model
	prompt  int           // the prompt's tokens, as estimated at Select
	compute int           // the tokens the chosen worker was predicted to compute
	ahead   int           // the prompt tokens pending on the chosen worker at Select
	ttft    time.Duration // the first token's time, once FirstByte told it
}

// active reports whether the pressure model places d: a request with a session key, with some
// candidate of known KV capacity; the candidates' capacities are brought up to date.
func (pr *pressure) active(d *decision) bool {
	if pr == nil || d.key == "" || d.in.Request.PreviousResponseID != "" {
		return false
	}
	known := false
	for _, w := range d.in.Candidates {
		c := w.KVCapacity()
		pr.res.SetCapacity(w.ID(), int(c))
		known = known || c > 0
	}
	return known
}

// promptTokens is the request's prompt in tokens: its own when it came with them, else its size
// at the bytes a token has taken in the answers so far.
func (pr *pressure) promptTokens(d *decision) int {
	if n := len(d.prompt.Tokens); n > 0 {
		return n
	}
	return int(float64(d.in.Size) / math.Float64frombits(pr.bytesPerToken.Load()))
}

// learnSize teaches the bytes a token takes from a request of size bytes whose prompt was prompt
// tokens.
func (pr *pressure) learnSize(size, prompt int) {
	if size <= 0 || prompt <= 0 {
		return
	}
	for {
		old := pr.bytesPerToken.Load()
		v := math.Float64frombits(old)
		v += 0.1 * (float64(size)/float64(prompt) - v)
		if pr.bytesPerToken.CompareAndSwap(old, math.Float64bits(v)) {
			return
		}
	}
}

// cost is the first token's predicted time on w for a request that computes compute tokens there.
func (pr *pressure) cost(w *workers.Worker, compute int) time.Duration {
	return pr.ttft.TTFT(w.ID(), predict.Work{Compute: max(compute, 0), Ahead: int(w.PendingPrefillTokens())})
}

// place chooses for a request with a session key under the pressure model: the session's resident
// worker, a cheaper one, a new one with room, or a Hold.
func (p *Policy) place(d *decision) policy.Decision {
	pr := p.pressure
	in := d.in
	rec := &sessionRecord{key: d.model + "\x00" + d.key, prompt: pr.promptTokens(d)}
	s, known := pr.res.Session(rec.key)
	if w0, held, ok := p.resident(d, rec, s, known); ok {
		stay := pr.cost(w0, rec.prompt-held)
		if w, cost, compute := p.cheapestWithRoom(d, rec, w0); w != nil && float64(cost) < moveMargin*float64(stay) {
			return p.pressured(d, rec, w, LabelSessionMoved, compute, cost)
		}
		return p.pressured(d, rec, w0, LabelSessionMatch, rec.prompt-held, stay)
	}
	// Choosing a new session's worker and claiming it are one step, so that placements running at
	// once see each other.
	pr.claims.placing.Lock()
	defer pr.claims.placing.Unlock()
	w, cost, compute := p.cheapestWithRoom(d, rec, nil)
	label := LabelKVRoom
	switch {
	case w == nil && pr.queue != nil && !in.HoldOver:
		return policy.Decision{Hold: &policy.Hold{Queue: pr.queue, Need: rec.prompt, Served: s.Served}}
	case w == nil:
		w, cost, compute = p.cheapest(d, rec, in.Candidates)
		label = LabelKVRoomExhausted
	case in.Held:
		label = LabelKVRoomWaited
	case known:
		label = LabelSessionEvicted
	}
	pr.claims.add(rec.key, w.ID())
	return p.pressured(d, rec, w, label, compute, cost)
}

// resident is the candidate whose cache holds the session, and the prompt tokens it holds; ok is
// false when none does. The session store (shared by the router's replicas) names the session's
// worker; the residency model (s, when known) says whether that worker's cache still holds it,
// and the engine's events must not have reported its first block evicted. A session the model
// does not follow on that worker (another replica placed or moved it, or it was forgotten here)
// is taken as resident there, its working set unknown: the store's word is the best there is,
// and the turn makes the session known here.
func (p *Policy) resident(d *decision, rec *sessionRecord, s residency.Session, known bool) (*workers.Worker, int, bool) {
	id, ok, err := p.store.Get(d.ctx, d.model, d.key)
	if err != nil || !ok {
		return nil, 0, false
	}
	held := 0
	if known && s.Worker == id {
		if !s.Resident {
			return nil, 0, false
		}
		held = min(s.Prompt, rec.prompt)
	}
	w := candidate(d.in.Candidates, id)
	if w == nil {
		return nil, 0, false
	}
	if p.sessionEvicted(d, w) {
		p.pressure.res.Evicted(rec.key)
		return nil, 0, false
	}
	return w, held, true
}

// pressured is the decision for w, which computes compute tokens of the request in a predicted
// ttft.
func (p *Policy) pressured(d *decision, rec *sessionRecord, w *workers.Worker, label string, compute int, ttft time.Duration) policy.Decision {
	rec.compute, rec.ahead = compute, int(w.PendingPrefillTokens())
	match := 0.0
	if rec.prompt > 0 {
		match = float64(rec.prompt-compute) / float64(rec.prompt)
	}
	return policy.Decision{Worker: w, Label: label, Match: match, Prefill: compute, TTFT: ttft,
		State: &choice{forget: d.forget, session: rec}}
}

// cheapestWithRoom is the candidate other than not with room for rec's working set that predicts
// the earliest first token, the tokens it computes and that time; nil when none has room.
func (p *Policy) cheapestWithRoom(d *decision, rec *sessionRecord, not *workers.Worker) (*workers.Worker, time.Duration, int) {
	room := make([]*workers.Worker, 0, len(d.in.Candidates))
	for _, w := range d.in.Candidates {
		if w != not && p.pressure.res.FitsOn(w.ID(), rec.prompt) {
			room = append(room, w)
		}
	}
	if len(room) == 0 {
		return nil, 0, 0
	}
	return p.cheapest(d, rec, room)
}

// cheapest is the worker of ws that predicts the earliest first token for a session placed
// anew, the tokens it computes there and that time, among the workers with at most spread live
// sessions more than the fewest: a prefix other sessions share (a common system prompt and tools)
// is worth one prefill on each worker, and piling sessions onto the worker that computed it
// first would leave the others idle while its cache fills. Among equal times, the worker with the
// fewest live sessions, then the one with the most room, then as leastLoaded.
func (p *Policy) cheapest(d *decision, rec *sessionRecord, ws []*workers.Worker) (*workers.Worker, time.Duration, int) {
	pr := p.pressure
	fewest := math.MaxInt
	for _, w := range ws {
		fewest = min(fewest, pr.live(w.ID()))
	}
	spreadOut := make([]*workers.Worker, 0, len(ws))
	for _, w := range ws {
		if pr.live(w.ID()) <= fewest+spread {
			spreadOut = append(spreadOut, w)
		}
	}
	ws = spreadOut
	held := p.treeHeld(d, rec.prompt)
	var best []*workers.Worker
	var bestCost time.Duration
	for _, w := range ws {
		cost := pr.cost(w, rec.prompt-held[w.ID()])
		switch {
		case best == nil || cost < bestCost:
			best, bestCost = append(best[:0], w), cost
		case cost == bestCost:
			best = append(best, w)
		}
	}
	if len(best) > 1 {
		best = lowest(best, func(w *workers.Worker) int64 { return int64(pr.live(w.ID())) })
	}
	if len(best) > 1 {
		best = lowest(best, func(w *workers.Worker) int64 { room, _ := pr.res.Room(w.ID()); return -int64(room) })
	}
	w := p.leastLoaded(d, best)
	return w, bestCost, rec.prompt - held[w.ID()]
}

// treeHeld is, in prompt tokens, what each worker holds of the request's text by the tree.
func (p *Policy) treeHeld(d *decision, prompt int) map[tenant.ID]int {
	if d.text == "" || prompt <= 0 {
		return nil
	}
	holdings := p.tree.Holdings(d.model, d.text, nil)
	held := make(map[tenant.ID]int, len(holdings))
	for _, h := range holdings {
		held[h.Tenant] = min(h.Held*prompt/len(d.text), prompt)
	}
	return held
}

// live is the count of worker's live sessions, those placed there and not yet accepted included.
func (pr *pressure) live(worker tenant.ID) int {
	return pr.res.Live(worker) + pr.claims.onWorker(worker)
}

// started, firstByte and ended follow a pressured decision through its attempt. The session is
// recorded on its worker before its claim ends, so that it counts there throughout.
func (pr *pressure) started(rec *sessionRecord, w *workers.Worker) {
	pr.res.Started(rec.key, w.ID(), rec.prompt)
	pr.claims.release(rec.key)
}

func (pr *pressure) ended(in policy.Input, rec *sessionRecord, w *workers.Worker, o workers.Outcome, u policy.Usage) {
	ok := o == workers.Succeeded && u.Prompt > 0
	pr.res.Ended(rec.key, u.Prompt, u.Output, ok)
	if ok {
		pr.learnSize(in.Size, u.Prompt)
		if rec.ttft > 0 {
			compute := rec.compute
			if u.Known {
				compute = u.Prompt - u.Cached
			}
			pr.ttft.Observe(w.ID(), predict.Work{Compute: compute, Ahead: rec.ahead}, rec.ttft)
		}
	}
	if pr.queue != nil {
		pr.queue.Offer() // the working set changed, or a turn ended: room may have appeared
	}
}

// broadcaster is a shared session store that carries messages between the router's replicas.
type broadcaster interface {
	Broadcast(name string) *session.Broadcast
}

// applyChanges applies a message of residency changes another replica's policy made.
func (p *Policy) applyChanges(msg []byte) {
	for len(msg) > 0 {
		c, rest, err := residency.ReadChange(msg)
		if err != nil {
			return
		}
		p.pressure.res.Apply(c)
		msg = rest
	}
}
