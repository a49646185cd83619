package session

import (
	"context"
	"math"
	"strings"
	"sync"
	"time"
)

// Defaults for MemoryOptions.
const (
	DefaultTTL        = time.Hour
	DefaultMaxEntries = 1 << 20
)

// sweepBatch bounds how many expired entries Sweep drops per lock hold, so a sweep after a
// quiet hour does not stall routing for that model.
const sweepBatch = 1024

// MemoryOptions configure a Memory store. Zero values take the defaults.
type MemoryOptions struct {
	// TTL is how long an entry lives after it was last set or read. Default 1h.
	TTL time.Duration
	// MaxEntries is the capacity per model; at capacity the least recently used entry is
	// evicted. Default 1048576, at most math.MaxInt32.
	MaxEntries int
	// Now is the clock; tests inject one. Default time.Now.
	Now func() time.Time
	// OnEvict, if set, is told about entries that left the store on their own, for metrics.
	// It is called without any lock held.
	OnEvict func(model string, reason EvictReason, n int)
}

// ApplyDefaults fills zero or out-of-range fields with their defaults.
func (o *MemoryOptions) ApplyDefaults() {
	if o.TTL <= 0 {
		o.TTL = DefaultTTL
	}
	if o.MaxEntries <= 0 {
		o.MaxEntries = DefaultMaxEntries
	}
	o.MaxEntries = min(o.MaxEntries, math.MaxInt32)
	if o.Now == nil {
		o.Now = time.Now
	}
}

// Memory is the in-process Store: per model, a map from session key to worker tenant with a
// TTL and a least-recently-used capacity bound. Each model has its own lock, so sessions of
// one model never wait on another's. Its methods never return errors.
//
// Expired entries are dropped lazily (a Get of an expired entry is a miss and removes it), by
// Sweep, and first when a full model needs room. Time is read from the monotonic clock; an
// injected clock that runs backwards makes entries live longer, never shorter.
type Memory struct {
	opts MemoryOptions
	ttl  int64 // nanoseconds
	// epoch is the clock reading at creation; access times are nanoseconds since it, which
	// uses the monotonic clock when Now is time.Now, so wall-clock steps do not expire or
	// revive sessions.
	epoch  time.Time
	models sync.Map
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty store; see MemoryOptions for the defaults.
func NewMemory(opts MemoryOptions) *Memory {
	opts.ApplyDefaults()
	return &Memory{opts: opts, ttl: int64(opts.TTL), epoch: opts.Now()}
}

func (m *Memory) now() int64 { return int64(m.opts.Now().Sub(m.epoch)) }

func (m *Memory) expired(lastUsed, now int64) bool { return now-lastUsed >= m.ttl }

func (m *Memory) report(model string, reason EvictReason, n int) {
	if n > 0 && m.opts.OnEvict != nil {
		m.opts.OnEvict(model, reason, n)
	}
}

// lookup returns the model's sessions, or nil if the model has none.
func (m *Memory) lookup(model string) *modelSessions {
	if ms, ok := m.models.Load(model); ok {
		return ms.(*modelSessions)
	}
	return nil
}

func (m *Memory) lookupOrCreate(model string) *modelSessions {
	if ms := m.lookup(model); ms != nil {
		return ms
	}
	ms, _ := m.models.LoadOrStore(strings.Clone(model), newModelSessions())
	return ms.(*modelSessions)
}

// Get returns the tenant for key and refreshes the entry. An expired entry is removed and
// reported as a miss.
func (m *Memory) Get(_ context.Context, model, key string) (string, bool, error) {
	ms := m.lookup(model)
	if ms == nil {
		return "", false, nil
	}
	ms.mu.Lock()
	i, ok := ms.index[key]
	if !ok {
		ms.mu.Unlock()
		return "", false, nil
	}
	now := m.now() // read under the lock, so list order is access-time order
	e := &ms.entries[i]
	if m.expired(e.lastUsed, now) {
		ms.removeLocked(i)
		ms.mu.Unlock()
		m.report(model, SessionTTL, 1)
		return "", false, nil
	}
	e.lastUsed = now
	ms.moveToFrontLocked(i)
	tenant := ms.tenants.names[e.tenant]
	ms.mu.Unlock()
	return tenant, true, nil
}

// Set points key at tenant and makes it the most recently used entry. Adding a key to a
// full model evicts its least recently used entry (reported as SessionTTL if that entry had
// expired anyway, else SessionCapacity).
func (m *Memory) Set(_ context.Context, model, key, tenant string) error {
	ms := m.lookupOrCreate(model)
	expired, evicted := 0, 0
	ms.mu.Lock()
	now := m.now() // read under the lock, so list order is access-time order
	if i, ok := ms.index[key]; ok {
		e := &ms.entries[i]
		if ms.tenants.names[e.tenant] != tenant {
			ms.tenants.release(e.tenant)
			e.tenant = ms.tenants.acquire(tenant)
		}
		e.lastUsed = now
		ms.moveToFrontLocked(i)
		ms.mu.Unlock()
		return nil
	}
	for len(ms.index) >= m.opts.MaxEntries {
		if m.expired(ms.entries[ms.tail].lastUsed, now) {
			expired++
		} else {
			evicted++
		}
		ms.removeLocked(ms.tail)
	}
	ms.addLocked(strings.Clone(key), ms.tenants.acquire(tenant), now)
	ms.mu.Unlock()
	m.report(model, SessionTTL, expired)
	m.report(model, SessionCapacity, evicted)
	return nil
}

// Delete removes key from model, if present.
func (m *Memory) Delete(_ context.Context, model, key string) error {
	ms := m.lookup(model)
	if ms == nil {
		return nil
	}
	ms.mu.Lock()
	if i, ok := ms.index[key]; ok {
		ms.removeLocked(i)
	}
	ms.mu.Unlock()
	return nil
}

// RemoveTenantsWithBase drops, in every model, the entries pointing at base or
// base+"@<rank>", and reports them as WorkerRemoved. A model that never saw such a tenant is
// skipped without scanning; otherwise its entries are scanned once under its lock.
func (m *Memory) RemoveTenantsWithBase(_ context.Context, base string) error {
	m.models.Range(func(model, value any) bool {
		ms := value.(*modelSessions)
		ms.mu.Lock()
		gone := ms.tenants.withBase(base)
		removed := 0
		if len(gone) > 0 {
			for i := ms.head; i != none; {
				next := ms.entries[i].next
				if containsID(gone, ms.entries[i].tenant) {
					ms.removeLocked(i)
					removed++
				}
				i = next
			}
		}
		ms.mu.Unlock()
		m.report(model.(string), WorkerRemoved, removed)
		return true
	})
	return nil
}

// Len returns the number of entries held for model, including expired ones not yet dropped.
func (m *Memory) Len(model string) int {
	ms := m.lookup(model)
	if ms == nil {
		return 0
	}
	ms.mu.Lock()
	defer ms.mu.Unlock()
	return len(ms.index)
}

// Counts returns the number of entries held for each model that has any.
func (m *Memory) Counts() map[string]int {
	out := map[string]int{}
	m.models.Range(func(model, value any) bool {
		ms := value.(*modelSessions)
		ms.mu.Lock()
		n := len(ms.index)
		ms.mu.Unlock()
		if n > 0 {
			out[model.(string)] = n
		}
		return true
	})
	return out
}

// Sweep drops the expired entries of every model and returns how many it dropped. The
// least recently used list is ordered by access time, so it only visits expired entries.
func (m *Memory) Sweep() int {
	total := 0
	m.models.Range(func(model, value any) bool {
		ms := value.(*modelSessions)
		dropped := 0
		for {
			batch := 0
			ms.mu.Lock()
			now := m.now()
			for batch < sweepBatch && ms.tail != none && m.expired(ms.entries[ms.tail].lastUsed, now) {
				ms.removeLocked(ms.tail)
				batch++
			}
			ms.mu.Unlock()
			dropped += batch
			if batch < sweepBatch {
				break
			}
		}
		m.report(model.(string), SessionTTL, dropped)
		total += dropped
		return true
	})
	return total
}
