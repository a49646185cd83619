package session

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// Operation names and results reported to FallbackOptions.Observe; they are metric label values.
const (
	OpGet    = "get"
	OpSet    = "set"
	OpDelete = "delete"
	OpPing   = "ping"

	ResultHit     = "hit"     // get: the primary knew the session
	ResultMiss    = "miss"    // get: the primary did not
	ResultOK      = "ok"      // set, delete, ping: done
	ResultError   = "error"   // the primary failed or timed out; the local store answered
	ResultSkipped = "skipped" // the primary is marked down; the local store answered without trying it
)

// DefaultRetryInterval is how long a failed primary is left alone before one call tries it again.
const DefaultRetryInterval = time.Second

// Primary is a shared store the Fallback puts first.
type Primary interface {
	Store
	Ping(ctx context.Context) error
}

// FallbackOptions configure a Fallback store.
type FallbackOptions struct {
	// Backend names the primary in Status ("redis").
	Backend string
	// RetryInterval is how long the primary is skipped after a failure before one call tries
	// it again. Default 1s.
	RetryInterval time.Duration
	// Observe, if set, is told about every call: the operation, its result and, when the
	// primary was tried, how long it took (0 when skipped).
	Observe func(op, result string, d time.Duration)
	// OnError, if set, is told about every failed call of the primary, before Observe.
	OnError func(op string)
	// Log receives the failures, at most one line per second, and the recoveries.
	Log *slog.Logger
}

// Fallback puts a shared primary store (Redis) in front of a local Memory store so that a
// session store outage never fails or stalls a request:
//
//   - Every call tries the primary first (its calls are bounded by their own timeout). When
//     it fails, the answer comes from the local store, the error is counted and logged (at
//     most once per second), and the primary is marked down (unless the call only waited for
//     a free connection: ErrBusy).
//   - While the primary is down, calls go straight to the local store, except one call per
//     RetryInterval, which tries the primary again; the first success marks it up. The
//     primary's client reconnects by itself, so recovery needs no restart.
//   - Every Set and every primary hit also teaches the local store, so a replica keeps the
//     sessions it has served through an outage. The local store never answers a read while
//     the primary is up, with one exception: when the primary misses a session the local
//     store knows (it was placed during an outage, or the primary lost its data), the local
//     entry is returned and written back to the primary, so the other replicas learn it.
//
// Calls to the primary are made with the caller's values but not its cancellation, so a
// client that goes away does not count as a store failure; the primary's timeout bounds them.
type Fallback struct {
	primary Primary
	local   *Memory
	opts    FallbackOptions
	epoch   time.Time

	// downUntil is 0 while the primary is up; while it is down, the time (ns since epoch)
	// after which one call may try it again.
	downUntil atomic.Int64
	lastLog   atomic.Int64 // ns since epoch of the last failure log line
	muted     atomic.Int64 // failures not logged since then

	mu          sync.Mutex
	lastErr     string
	lastErrTime time.Time
}

var _ Store = (*Fallback)(nil)

// NewFallback returns a store that uses primary and falls back to local.
func NewFallback(primary Primary, local *Memory, opts FallbackOptions) *Fallback {
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = DefaultRetryInterval
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	f := &Fallback{primary: primary, local: local, opts: opts, epoch: time.Now()}
	f.lastLog.Store(-int64(time.Second)) // the first failure is logged
	return f
}

// Local returns the local fallback store.
func (f *Fallback) Local() *Memory { return f.local }

func (f *Fallback) now() int64 { return int64(time.Since(f.epoch)) }

// tryPrimary reports whether this call may use the primary: always while it is up; while it
// is down, only the one call that claims the next retry slot.
func (f *Fallback) tryPrimary() bool {
	until := f.downUntil.Load()
	if until == 0 {
		return true
	}
	now := f.now()
	return now >= until && f.downUntil.CompareAndSwap(until, now+int64(f.opts.RetryInterval))
}

func (f *Fallback) observe(op, result string, d time.Duration) {
	if f.opts.Observe != nil {
		f.opts.Observe(op, result, d)
	}
}

// succeeded marks the primary up after a successful call.
func (f *Fallback) succeeded() {
	if f.downUntil.Load() != 0 && f.downUntil.Swap(0) != 0 {
		f.opts.Log.Info("session store reachable again", "backend", f.opts.Backend)
	}
}

// failed counts, records and (rate-limited) logs a failed call, and marks the primary down
// unless the call only found the primary's connections all busy (ErrBusy): that says nothing
// about the primary, so the next calls still try it.
func (f *Fallback) failed(op string, err error, d time.Duration) {
	now := f.now()
	if !errors.Is(err, ErrBusy) {
		f.downUntil.Store(max(now+int64(f.opts.RetryInterval), 1))
	}
	if f.opts.OnError != nil {
		f.opts.OnError(op)
	}
	f.observe(op, ResultError, d)
	f.mu.Lock()
	f.lastErr, f.lastErrTime = err.Error(), time.Now()
	f.mu.Unlock()
	last := f.lastLog.Load()
	if now-last < int64(time.Second) || !f.lastLog.CompareAndSwap(last, now) {
		f.muted.Add(1)
		return
	}
	f.opts.Log.Warn("session store failed; routing with the local session map",
		"backend", f.opts.Backend, "op", op, "error", err, "retry_in", f.opts.RetryInterval,
		"failures_not_logged", f.muted.Swap(0))
}

func detach(ctx context.Context) context.Context {
	if ctx == nil {
		return context.Background()
	}
	return context.WithoutCancel(ctx)
}

// Get asks the primary (refreshing the entry's TTL there) and falls back to the local store.
func (f *Fallback) Get(ctx context.Context, model, key string) (tenant.ID, bool, error) {
	if !f.tryPrimary() {
		f.observe(OpGet, ResultSkipped, 0)
		return f.local.Get(ctx, model, key)
	}
	pctx := detach(ctx)
	start := time.Now()
	worker, ok, err := f.primary.Get(pctx, model, key)
	d := time.Since(start)
	if err != nil {
		f.failed(OpGet, err, d)
		return f.local.Get(ctx, model, key)
	}
	f.succeeded()
	if ok {
		f.observe(OpGet, ResultHit, d)
		_ = f.local.Set(ctx, model, key, worker)
		return worker, true, nil
	}
	f.observe(OpGet, ResultMiss, d)
	worker, ok, _ = f.local.Get(ctx, model, key)
	if ok {
		f.setPrimary(pctx, model, key, worker)
	}
	return worker, ok, nil
}

// Set writes the primary synchronously (so this replica reads its own write) and the local store.
func (f *Fallback) Set(ctx context.Context, model, key string, worker tenant.ID) error {
	_ = f.local.Set(ctx, model, key, worker)
	if !f.tryPrimary() {
		f.observe(OpSet, ResultSkipped, 0)
		return nil
	}
	f.setPrimary(detach(ctx), model, key, worker)
	return nil
}

func (f *Fallback) setPrimary(ctx context.Context, model, key string, worker tenant.ID) {
	f.callPrimary(OpSet, func() error { return f.primary.Set(ctx, model, key, worker) })
}

// callPrimary runs call, the operation op of the primary store, and records its outcome: a
// failure (see failed), or a success with its duration.
func (f *Fallback) callPrimary(op string, call func() error) {
	start := time.Now()
	err := call()
	d := time.Since(start)
	if err != nil {
		f.failed(op, err, d)
		return
	}
	f.succeeded()
	f.observe(op, ResultOK, d)
}

// Delete removes key from both stores.
func (f *Fallback) Delete(ctx context.Context, model, key string) error {
	_ = f.local.Delete(ctx, model, key)
	if !f.tryPrimary() {
		f.observe(OpDelete, ResultSkipped, 0)
		return nil
	}
	pctx := detach(ctx)
	f.callPrimary(OpDelete, func() error { return f.primary.Delete(pctx, model, key) })
	return nil
}

// RemoveTenantsWithBase drops the worker's entries from the local store and passes the call to
// the primary (the Redis store leaves its entries to be overwritten or expire).
func (f *Fallback) RemoveTenantsWithBase(ctx context.Context, base string) error {
	_ = f.local.RemoveTenantsWithBase(ctx, base)
	_ = f.primary.RemoveTenantsWithBase(detach(ctx), base)
	return nil
}

// Sweep drops the local store's expired entries (the primary expires its own).
func (f *Fallback) Sweep() int { return f.local.Sweep() }

// Check pings the primary, unless it is down and its retry slot has not come, and updates the
// state that Status reports.
func (f *Fallback) Check(ctx context.Context) {
	if !f.tryPrimary() {
		return
	}
	pctx := detach(ctx)
	f.callPrimary(OpPing, func() error { return f.primary.Ping(pctx) })
}

// Status is the store's state as /health shows it.
type Status struct {
	Backend       string     `json:"backend"`
	Reachable     bool       `json:"reachable"`
	LastError     string     `json:"last_error,omitempty"`
	LastErrorTime *time.Time `json:"last_error_time,omitempty"`
}

// Status reports whether the primary is reachable (it is probed first when it is down and a
// retry is due) and its last error, if any.
func (f *Fallback) Status(ctx context.Context) Status {
	f.Check(ctx)
	s := Status{Backend: f.opts.Backend, Reachable: f.downUntil.Load() == 0}
	f.mu.Lock()
	if f.lastErr != "" {
		t := f.lastErrTime
		s.LastError, s.LastErrorTime = f.lastErr, &t
	}
	f.mu.Unlock()
	return s
}
