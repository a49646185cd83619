// Package residency models which conversations each worker's KV cache holds, by their working
// sets: a session's working set is the tokens its last turn left in the engine (its prompt and
// its output), a worker's capacity is the tokens its KV cache holds, and an engine evicts the
// least recently used blocks first. From these the router can tell, without asking anyone,
// whether a session's cache is likely still on its worker (Resident), and how much of a worker's
// cache the sessions that will soon come back already claim (Room). Placement and session
// admission are built on both: a worker whose live sessions fill its cache takes no new session,
// since the engine would make room by evicting one of theirs.
//
// It is pure logic: the policy tells it what it placed (Started), how the turn ended (Ended),
// what the engines' events showed evicted (Evicted), and the capacities the engines report
// (SetCapacity); it never blocks and does no I/O. A Tracker is safe for concurrent use.
package residency

import (
	"container/list"
	"sync"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// Defaults for Options.
const (
	DefaultHeadroom    = 0.1
	DefaultLiveGaps    = 4
	DefaultMinLive     = 2 * time.Second
	DefaultMaxLive     = 10 * time.Minute
	DefaultFirstLive   = 30 * time.Second
	DefaultMaxSessions = 1 << 16
)

// gapWeight is the weight of a session's newest pause in the average of its pauses.
const gapWeight = 0.3

// Options configure a Tracker. Zero values take the defaults.
type Options struct {
	// Headroom is the share of each worker's capacity kept out of Room: the sessions placed grow
	// by a turn's tokens every turn, and requests without a session need blocks too. 0.1.
	Headroom float64
	// A session is live (it will be back soon, and its working set is claimed) while a request of
	// it is in flight, and for LiveGaps times its own average pause between turns after its last
	// one ended, within [MinLive, MaxLive]; FirstLive is that horizon for a session that has had
	// one turn only. Live sessions count against Room; a session idle for longer is no longer
	// counted, though its cache may still be resident.
	LiveGaps  float64
	MinLive   time.Duration
	MaxLive   time.Duration
	FirstLive time.Duration
	// MaxSessions bounds the sessions followed, all workers together; past it the least recently
	// used is forgotten (its next turn is placed as a new session's). 65536.
	MaxSessions int
	// Now is the clock; tests inject one. time.Now.
	Now func() time.Time
	// OnChange, when set, is handed every change the tracker's own calls make (not those it
	// Applies), to share with the router's other replicas. It must not block.
	OnChange func(Change)
}

// ApplyDefaults fills zero or out-of-range fields.
func (o *Options) ApplyDefaults() {
	if o.Headroom <= 0 || o.Headroom >= 1 {
		o.Headroom = DefaultHeadroom
	}
	if o.LiveGaps <= 0 {
		o.LiveGaps = DefaultLiveGaps
	}
	if o.MinLive <= 0 {
		o.MinLive = DefaultMinLive
	}
	if o.MaxLive <= 0 {
		o.MaxLive = DefaultMaxLive
	}
	o.MaxLive = max(o.MaxLive, o.MinLive)
	if o.FirstLive <= 0 {
		o.FirstLive = DefaultFirstLive
	}
	o.FirstLive = min(max(o.FirstLive, o.MinLive), o.MaxLive)
	if o.MaxSessions <= 0 {
		o.MaxSessions = DefaultMaxSessions
	}
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Session is what the tracker knows of one session.
type Session struct {
	// Worker is the worker its last turn was placed on.
	Worker tenant.ID
	// Tokens is its working set: its last turn's prompt and output tokens, or the prompt of a
	// turn still in flight when that is larger.
	Tokens int
	// Prompt is its last turn's prompt tokens: the prefix of its next turn its worker holds, while
	// resident (its output is cached too, but a client seldom sends it back token for token).
	Prompt int
	// Resident says its worker's cache likely still holds it: no event reported its blocks
	// evicted, and the working sets of the sessions its worker served since it last ran, its own
	// included, fit the worker's capacity (an engine evicts the least recently used blocks
	// first). Always true on a worker of unknown capacity, unless an event said otherwise.
	Resident bool
	// Live says it will likely be back soon: a turn is in flight, or its last one ended within
	// its horizon (Options.LiveGaps).
	Live bool
	// Served is the prompt tokens its turns asked for so far, its attained service, which the
	// session admission queue orders waiting sessions by (least first).
	Served int64
	// Turns counts its turns placed.
	Turns int
}

// session is one followed session; it sits in its worker's list, most recently used first, and
// in the tracker's list for the MaxSessions bound.
type session struct {
	key      string
	worker   *worker
	tokens   int
	prompt   int
	inFlight int
	remote   int // of inFlight, the turns other replicas started (Apply)
	evicted  bool
	turns    int
	served   int64
	lastEnd  time.Time // when its last turn ended; zero while its first is in flight
	lastUse  time.Time // when a turn of it last started or ended
	gap      time.Duration
	inWorker *list.Element
	inAll    *list.Element
}

type worker struct {
	name     tenant.ID
	capacity int        // tokens; 0: unknown
	sessions *list.List // of *session, most recently used first
}

// Tracker follows sessions' working sets and workers' capacities.
type Tracker struct {
	opts     Options
	mu       sync.Mutex
	workers  map[tenant.ID]*worker
	sessions map[string]*session
	all      *list.List // of *session, most recently used first
}

// New returns an empty tracker.
func New(opts Options) *Tracker {
	opts.ApplyDefaults()
	return &Tracker{opts: opts, workers: map[tenant.ID]*worker{}, sessions: map[string]*session{}, all: list.New()}
}

// Options returns the tracker's options, defaults applied.
func (t *Tracker) Options() Options { return t.opts }

func (t *Tracker) worker(name tenant.ID) *worker {
	w := t.workers[name]
	if w == nil {
		w = &worker{name: name, sessions: list.New()}
		t.workers[name] = w
	}
	return w
}

// SetCapacity records the tokens worker's KV cache holds (0: unknown, which turns the room
// accounting off for it).
func (t *Tracker) SetCapacity(worker tenant.ID, tokens int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.worker(worker).capacity = max(tokens, 0)
}

// Capacity is the tokens worker's KV cache holds, 0 when unknown.
func (t *Tracker) Capacity(worker tenant.ID) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	if w := t.workers[worker]; w != nil {
		return w.capacity
	}
	return 0
}

// RemoveWorker forgets worker and the sessions placed on it: their next turns are new sessions'.
func (t *Tracker) RemoveWorker(worker tenant.ID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.workers[worker]
	if w == nil {
		return
	}
	for e := w.sessions.Front(); e != nil; e = e.Next() {
		s := e.Value.(*session)
		t.all.Remove(s.inAll)
		delete(t.sessions, s.key)
	}
	delete(t.workers, worker)
}

// Session returns what is known of key.
func (t *Tracker) Session(key string) (Session, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	s := t.sessions[key]
	if s == nil {
		return Session{}, false
	}
	now := t.opts.Now()
	return Session{Worker: s.worker.name, Tokens: s.tokens, Prompt: s.prompt, Resident: t.resident(s), Live: t.live(s, now),
		Served: s.served, Turns: s.turns}, true
}

// resident: see Session.Resident.
func (t *Tracker) resident(s *session) bool {
	if s.evicted {
		return false
	}
	if s.worker.capacity == 0 {
		return true
	}
	used := 0
	for e := s.worker.sessions.Front(); e != nil; e = e.Next() {
		o := e.Value.(*session)
		if !o.evicted {
			used += o.tokens
		}
		if o == s {
			break
		}
	}
	return used <= s.worker.capacity
}

// live: see Session.Live.
func (t *Tracker) live(s *session, now time.Time) bool {
	if s.inFlight > s.remote || (s.remote > 0 && now.Sub(s.lastUse) < t.opts.MaxLive) {
		return true // a remote turn past MaxLive: its end was lost on the way
	}
	return !s.evicted && now.Sub(s.lastEnd) < t.horizon(s)
}

// horizon is how long after its last turn s stays live.
func (t *Tracker) horizon(s *session) time.Duration {
	if s.turns < 2 {
		return t.opts.FirstLive
	}
	h := time.Duration(t.opts.LiveGaps * float64(s.gap))
	return min(max(h, t.opts.MinLive), t.opts.MaxLive)
}

// Room is the tokens worker can take for a new session without its live sessions' working sets
// passing its capacity less the headroom; it may be negative. ok is false when the worker's
// capacity is unknown.
func (t *Tracker) Room(worker tenant.ID) (room int, ok bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.workers[worker]
	if w == nil || w.capacity == 0 {
		return 0, false
	}
	room, _ = t.room(w, t.opts.Now())
	return room, true
}

// room is w's room and the count of its live sessions.
func (t *Tracker) room(w *worker, now time.Time) (room, live int) {
	room = int(float64(w.capacity) * (1 - t.opts.Headroom))
	for e := w.sessions.Front(); e != nil; e = e.Next() {
		if s := e.Value.(*session); t.live(s, now) {
			room -= s.tokens
			live++
		}
	}
	return room, live
}

// FitsOn reports whether worker can take a new session of need tokens: its capacity is unknown,
// its room holds need, or none of its sessions is live (there is nothing to protect, and waiting
// would not make a working set larger than the whole cache fit).
func (t *Tracker) FitsOn(worker tenant.ID, need int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.workers[worker]
	return w == nil || t.fits(w, need, t.opts.Now())
}

func (t *Tracker) fits(w *worker, need int, now time.Time) bool {
	if w.capacity == 0 {
		return true
	}
	room, live := t.room(w, now)
	return room >= need || live == 0
}

// Fits reports whether some worker of known capacity can take a new session of need tokens
// (FitsOn).
func (t *Tracker) Fits(need int) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.opts.Now()
	for _, w := range t.workers {
		if w.capacity > 0 && t.fits(w, need, now) {
			return true
		}
	}
	return false
}

// Live is the count of worker's live sessions.
func (t *Tracker) Live(worker tenant.ID) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	w := t.workers[worker]
	if w == nil {
		return 0
	}
	_, live := t.room(w, t.opts.Now())
	return live
}

// Started records a turn of key placed on worker with prompt tokens: the session moves there if
// it was elsewhere (its cache there is a new one), becomes its worker's most recently used, and
// is live while the turn runs.
func (t *Tracker) Started(key string, worker tenant.ID, prompt int) {
	t.record(Change{Kind: ChangeStarted, Key: key, Worker: worker, Prompt: prompt})
}

func (t *Tracker) started(key string, worker tenant.ID, prompt int) {
	now := t.opts.Now()
	s := t.sessions[key]
	switch {
	case s == nil:
		s = &session{key: key}
		t.sessions[key] = s
		s.inAll = t.all.PushFront(s)
		t.bound()
	default:
		t.all.MoveToFront(s.inAll)
	}
	if s.worker == nil || s.worker.name != worker {
		if s.worker != nil {
			s.worker.sessions.Remove(s.inWorker)
		}
		s.worker = t.worker(worker)
		s.inWorker = s.worker.sessions.PushFront(s)
		s.tokens, s.prompt = 0, 0
	} else {
		s.worker.sessions.MoveToFront(s.inWorker)
	}
	if s.turns > 0 && s.inFlight == 0 && !s.lastEnd.IsZero() {
		pause := now.Sub(s.lastEnd)
		if s.turns == 1 {
			s.gap = pause
		} else {
			s.gap = time.Duration(gapWeight*float64(pause) + (1-gapWeight)*float64(s.gap))
		}
	}
	s.evicted = false
	s.turns++
	s.inFlight++
	s.served += int64(max(prompt, 0))
	s.tokens = max(s.tokens, prompt)
	s.lastUse = now
}

// Ended records the end of a turn of key that Started: its working set becomes the prompt and
// output tokens the worker reported (ok false: it reported none, and the working set stays).
func (t *Tracker) Ended(key string, prompt, output int, ok bool) {
	t.record(Change{Kind: ChangeEnded, Key: key, Prompt: prompt, Output: output, OK: ok})
}

func (t *Tracker) ended(key string, prompt, output int, ok bool) {
	s := t.sessions[key]
	if s == nil || s.inFlight == 0 {
		return
	}
	s.inFlight--
	if ok && prompt > 0 {
		s.tokens, s.prompt = prompt+max(output, 0), prompt
	}
	now := t.opts.Now()
	s.lastEnd, s.lastUse = now, now
}

// Evicted records that key's worker no longer holds its cache (the engine's events reported its
// blocks removed): it is not resident, and not live, until its next turn.
func (t *Tracker) Evicted(key string) {
	t.record(Change{Kind: ChangeEvicted, Key: key})
}

func (t *Tracker) evicted(key string) {
	if s := t.sessions[key]; s != nil {
		s.evicted = true
	}
}

// Forget drops key, as when its turn failed before the worker held anything of it.
func (t *Tracker) Forget(key string) {
	t.record(Change{Kind: ChangeForgotten, Key: key})
}

func (t *Tracker) forget(key string) {
	if s := t.sessions[key]; s != nil {
		t.remove(s)
	}
}

// bound forgets the least recently used sessions past MaxSessions.
func (t *Tracker) bound() {
	for t.all.Len() > t.opts.MaxSessions {
		t.remove(t.all.Back().Value.(*session))
	}
}

func (t *Tracker) remove(s *session) {
	t.all.Remove(s.inAll)
	if s.worker != nil {
		s.worker.sessions.Remove(s.inWorker)
	}
	delete(t.sessions, s.key)
}

// Len is the number of sessions followed.
func (t *Tracker) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.sessions)
}
