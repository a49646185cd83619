package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultLevel is the one priority level of a Controller configured without levels.
const DefaultLevel = "default"

// defaultRetryAfter is the Retry-After hint when Options.RetryAfter is zero.
const defaultRetryAfter = time.Second

// Options configure a Controller. The zero value admits everything at once.
type Options struct {
	// MaxInFlight bounds the requests admitted and not yet released, router-wide; 0 means
	// unlimited.
	MaxInFlight int
	// Reserve is how many of the MaxInFlight places only the highest priority level may take:
	// the others start only while more than Reserve places are free. A request of the highest
	// level then rarely waits for a running one to end, however many lower ones are queued.
	// It must be less than MaxInFlight; 0 reserves nothing.
	Reserve int
	// QueueSize bounds the requests waiting, all levels together; 0 means no queue: a request
	// that cannot start at once is rejected with QueueFull.
	QueueSize int
	// QueueTimeout bounds one request's wait; past it the request is rejected with
	// QueueTimeout. 0 means no bound of its own (the request's context still applies).
	QueueTimeout time.Duration
	// Priorities names the levels, highest first. Empty means one level, DefaultLevel.
	Priorities []string
	// DefaultPriority is the level of a Ticket with no Priority; empty means the lowest level.
	DefaultPriority string
	// Ready, when set, reports whether one more request for model may start, given admitted,
	// the requests for model admitted and not yet released: the proxy compares it with the room
	// its workers have (the per-worker limit times the workers serving model). Counting admitted
	// requests rather than reading worker loads keeps the bound exact: a request admitted a
	// moment ago has not reached its worker yet. A request starts only when Ready is true;
	// otherwise it waits in its place and is offered again on every Permit.Release and Wake. It
	// is called with the Controller's lock held: it must be quick, must not block and must not
	// call the Controller.
	Ready func(model string, admitted int) bool
	// RetryAfter is the hint carried by QueueFull and QueueTimeout rejections, for the
	// Retry-After header; 0 means one second.
	RetryAfter time.Duration
	// Reporter receives the queue's measurements; nil reports nothing.
	Reporter Reporter
}

// Reporter receives the queue's measurements; the router's metrics implement it, so that this
// package does not import them. Priority values are the configured level names.
type Reporter interface {
	// QueueLength is the number of requests waiting at priority, told on every change. It is
	// called with the Controller's lock held (so the values arrive in order): it must be quick
	// and must not call the Controller.
	QueueLength(priority string, n int)
	// Waited observes how long an admitted request waited (0 when it started at once).
	Waited(priority string, d time.Duration)
	// Rejected counts a request refused for reason.
	Rejected(priority string, reason Reason)
}

// Reason says why a request was refused; its String is a bounded metric label value.
type Reason string

const (
	// QueueFull: the queue held QueueSize requests and none of them was less deserving, or the
	// request was waiting and was displaced by a more deserving arrival. Answer 429.
	QueueFull Reason = "queue_full"
	// QueueTimeout: the request waited QueueTimeout without starting. Answer 408, as the vLLM
	// router does (429 is for a full queue: the request did not wait).
	QueueTimeout Reason = "queue_timeout"
	// ClientGone: the request's context ended before it started. Nobody is left to answer.
	ClientGone Reason = "client_gone"
)

func (r Reason) String() string { return string(r) }

// Rejection is the error of a refused Admit. The request holds nothing: there is no Permit to
// release.
type Rejection struct {
	Reason   Reason
	Priority string
	// RetryAfter is the hint for the Retry-After header of the 429 or 408 answer; 0 for
	// ClientGone.
	RetryAfter time.Duration
	cause      error // the context's error, for ClientGone
}

func (r *Rejection) Error() string {
	if r.cause != nil {
		return fmt.Sprintf("admission: %s (%s): %v", r.Reason, r.Priority, r.cause)
	}
	return fmt.Sprintf("admission: %s (%s)", r.Reason, r.Priority)
}

// Unwrap returns the context's error of a ClientGone rejection, nil otherwise.
func (r *Rejection) Unwrap() error { return r.cause }

// ErrUnknownPriority is returned by Admit for a Ticket whose Priority names no level.
var ErrUnknownPriority = errors.New("admission: unknown priority")

// Ticket describes the request asking to start.
type Ticket struct {
	// Tenant is the fairness key: tenants at one priority take turns. It should come from a
	// bounded set (a client key's name, say); the queue holds state only for tenants that have
	// requests waiting.
	Tenant string
	// Priority names a configured level; empty means Options.DefaultPriority.
	Priority string
	// Model is handed to Options.Ready and means nothing else here.
	Model string
}

// Controller admits requests under the router-wide and per-worker limits, holding the ones
// that cannot start yet in a bounded queue ordered by priority, then round-robin across
// tenants, then arrival. It is safe for concurrent use. Each waiting request blocks its own
// goroutine only; no goroutine or timer outlives a call.
type Controller struct {
	opts   Options
	rep    Reporter
	index  map[string]int // level name (and "" for the default) → index in levels
	retry  time.Duration
	mu     sync.Mutex
	levels []level // highest priority first
	queued int     // waiters, all levels
	flight int     // admitted, not yet released
	// byModel counts the admitted requests of each model, for Ready; a model leaves it with its
	// last request, so it holds only models with requests in flight.
	byModel map[string]int
}

// New validates opts and returns a Controller.
func New(opts Options) (*Controller, error) {
	if opts.MaxInFlight < 0 || opts.QueueSize < 0 || opts.QueueTimeout < 0 || opts.RetryAfter < 0 || opts.Reserve < 0 {
		return nil, errors.New("admission: limits, queue size and durations must not be negative")
	}
	if opts.Reserve > 0 && opts.Reserve >= opts.MaxInFlight {
		return nil, errors.New("admission: the reserve must be less than MaxInFlight")
	}
	names := opts.Priorities
	if len(names) == 0 {
		names = []string{DefaultLevel}
	}
	c := &Controller{opts: opts, rep: opts.Reporter, index: make(map[string]int, len(names)+1), retry: opts.RetryAfter}
	if c.rep == nil {
		c.rep = nopReporter{}
	}
	if c.retry == 0 {
		c.retry = defaultRetryAfter
	}
	for i, name := range names {
		if name == "" {
			return nil, errors.New("admission: empty priority name")
		}
		if _, dup := c.index[name]; dup {
			return nil, fmt.Errorf("admission: priority %q named twice", name)
		}
		c.index[name] = i
		c.levels = append(c.levels, level{name: name, tenants: make(map[string]*tenantQueue)})
	}
	def := len(names) - 1
	if opts.DefaultPriority != "" {
		i, ok := c.index[opts.DefaultPriority]
		if !ok {
			return nil, fmt.Errorf("admission: default priority %q is not one of %v", opts.DefaultPriority, names)
		}
		def = i
	}
	c.index[""] = def
	return c, nil
}

// Priorities returns the level names, highest first.
func (c *Controller) Priorities() []string {
	out := make([]string, len(c.levels))
	for i := range c.levels {
		out[i] = c.levels[i].name
	}
	return out
}

// Admit returns when t may start, holding a Permit that must be released once the request is
// over, or with an error and nothing to release: a *Rejection (QueueFull means 429 with
// Retry-After, QueueTimeout 408; ClientGone means nobody is waiting for an answer), or
// ErrUnknownPriority. A request starts at once when nothing is waiting and the limits allow;
// otherwise it waits until the queue lets it start, the queue is full and nothing in it is
// less deserving (answered at once), QueueTimeout passes, or ctx ends (it leaves the queue at
// once).
func (c *Controller) Admit(ctx context.Context, t Ticket) (*Permit, error) {
	li, ok := c.index[t.Priority]
	if !ok {
		return nil, fmt.Errorf("%w %q", ErrUnknownPriority, t.Priority)
	}
	lv := &c.levels[li]
	if err := ctx.Err(); err != nil {
		return nil, c.reject(lv.name, ClientGone, err)
	}

	c.mu.Lock()
	if c.queued == 0 && c.room(li) && c.ready(t.Model) {
		c.take(t.Model)
		c.mu.Unlock()
		c.rep.Waited(lv.name, 0)
		return &Permit{c: c, model: t.Model}, nil
	}
	if c.queued >= c.opts.QueueSize {
		v := c.victim(li, t.Tenant)
		if v == nil {
			c.mu.Unlock()
			return nil, c.reject(lv.name, QueueFull, nil)
		}
		c.dequeue(v, displaced)
	}
	start := time.Now()
	w := &waiter{model: t.Model, level: li, ch: make(chan struct{})}
	lv.push(t.Tenant, w)
	c.queued++
	c.rep.QueueLength(lv.name, lv.n)
	c.dispatch() // the queue may hold only requests whose workers are busy, and t's are not
	state := w.state
	c.mu.Unlock()

	var reason Reason
	if state == waiting {
		var expired <-chan time.Time
		if c.opts.QueueTimeout > 0 {
			tm := time.NewTimer(c.opts.QueueTimeout)
			defer tm.Stop()
			expired = tm.C
		}
		select {
		case <-w.ch:
		case <-ctx.Done():
			reason = ClientGone
		case <-expired:
			reason = QueueTimeout
		}
		c.mu.Lock()
		if state = w.state; state == waiting {
			c.dequeue(w, waiting)
		}
		c.mu.Unlock()
	}

	switch state {
	case admitted:
		p := &Permit{c: c, model: t.Model, waited: time.Since(start)}
		if reason == ClientGone { // admitted as the client left: give the slot back
			p.Release()
			return nil, c.reject(lv.name, ClientGone, ctx.Err())
		}
		c.rep.Waited(lv.name, p.waited)
		return p, nil
	case displaced:
		return nil, c.reject(lv.name, QueueFull, nil)
	}
	if reason == ClientGone {
		return nil, c.reject(lv.name, ClientGone, ctx.Err())
	}
	return nil, c.reject(lv.name, reason, nil)
}

// Wake offers the queue's capacity again. Call it when a worker gains room without a Permit
// being released (a retried attempt closed, a worker joined or became healthy): only then can
// a request held by Options.Ready start. Without Ready it is never needed.
func (c *Controller) Wake() {
	c.mu.Lock()
	c.dispatch()
	c.mu.Unlock()
}

// InFlight returns the number of requests admitted and not yet released.
func (c *Controller) InFlight() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.flight
}

// Queued returns the number of requests waiting, all levels together.
func (c *Controller) Queued() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.queued
}

// Permit is one admitted request's place under the limits.
type Permit struct {
	c        *Controller
	model    string
	waited   time.Duration
	released atomic.Bool
}

// Release gives the place back and lets the next waiting request start. Only the first call
// counts, so every path that ends a request may call it. Close the request's worker attempt
// first, so that a request held by Options.Ready sees the worker's freed room.
func (p *Permit) Release() {
	if !p.released.CompareAndSwap(false, true) {
		return
	}
	c := p.c
	c.mu.Lock()
	c.flight--
	if c.byModel[p.model]--; c.byModel[p.model] <= 0 {
		delete(c.byModel, p.model)
	}
	c.dispatch()
	c.mu.Unlock()
}

// Waited returns how long the request waited in the queue (0 when it started at once).
func (p *Permit) Waited() time.Duration { return p.waited }

// ready reports whether Options.Ready lets one more request for model start.
func (c *Controller) ready(model string) bool {
	return c.opts.Ready == nil || c.opts.Ready(model, c.byModel[model])
}

// take counts one more admitted request for model.
func (c *Controller) take(model string) {
	c.flight++
	if c.byModel == nil {
		c.byModel = map[string]int{}
	}
	c.byModel[model]++
}

// room reports whether the router-wide limit lets one more request of level li start: the
// highest level may take every place, the others all but the reserve.
func (c *Controller) room(li int) bool {
	if c.opts.MaxInFlight == 0 {
		return true
	}
	limit := c.opts.MaxInFlight
	if li > 0 {
		limit -= c.opts.Reserve
	}
	return c.flight < limit
}

// dispatch admits waiters, in queue order, while the limits allow.
func (c *Controller) dispatch() {
	if c.queued == 0 || !c.room(0) {
		return
	}
	var notReady []string // models Ready refused in this pass
	ok := func(model string) bool {
		if c.opts.Ready == nil {
			return true
		}
		if slices.Contains(notReady, model) {
			return false
		}
		if c.ready(model) {
			return true
		}
		notReady = append(notReady, model)
		return false
	}
	for c.queued > 0 && c.room(0) {
		var w *waiter
		for i := range c.levels {
			if !c.room(i) {
				break // the levels below have no more room than this one
			}
			if w = c.levels[i].pick(ok); w != nil {
				break
			}
		}
		if w == nil {
			return
		}
		c.dequeue(w, admitted)
		c.take(w.model)
	}
}

// dequeue takes a waiting w out of the queue; a state other than waiting is told to its
// goroutine.
func (c *Controller) dequeue(w *waiter, to waitState) {
	l := &c.levels[w.level]
	l.remove(w)
	c.queued--
	c.rep.QueueLength(l.name, l.n)
	if to != waiting {
		w.state = to
		close(w.ch)
	}
}

// victim returns the waiter a full queue gives up for an arrival at level li from tenant, or
// nil when the arrival is the least deserving: the newest waiter of the tenant with the most
// waiters at the lowest level that has any, if that level is below li, or is li and that
// tenant has at least two more waiters there than the arriving tenant. So a flood at low
// priority cannot keep higher priorities out, and a flood from one tenant cannot keep its
// peers out.
func (c *Controller) victim(li int, tenant string) *waiter {
	for i := len(c.levels) - 1; i >= li; i-- {
		l := &c.levels[i]
		big := l.largest()
		if big == nil {
			continue
		}
		if i > li {
			return big.tail
		}
		own := 0
		if tq := l.tenants[tenant]; tq != nil {
			own = tq.n
		}
		if big.n > own+1 {
			return big.tail
		}
		return nil
	}
	return nil
}

// reject reports and returns a refusal.
func (c *Controller) reject(priority string, r Reason, cause error) error {
	c.rep.Rejected(priority, r)
	rej := &Rejection{Reason: r, Priority: priority, cause: cause}
	if r != ClientGone {
		rej.RetryAfter = c.retry
	}
	return rej
}

type nopReporter struct{}

func (nopReporter) QueueLength(string, int)      {}
func (nopReporter) Waited(string, time.Duration) {}
func (nopReporter) Rejected(string, Reason)      {}
