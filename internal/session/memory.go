package session

import (
	"context"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
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
	// MaxEntries is the capacity of the whole store, all models together: the store never
	// holds more entries than this, even while Sets run concurrently. Adding a key to a full
	// store evicts the store's least recently used entry, whichever model it belongs to.
	// Default 1048576, at most math.MaxInt32.
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
// TTL and a least-recently-used list, under one capacity for the whole store. Each model has
// its own lock, so sessions of one model never wait on another's. Its methods never return
// errors.
//
// The capacity is exact at every moment, not only once writers stop: an atomic total counts
// the entries of all models plus the slots that Sets in progress have claimed. A Set adding a
// key claims a slot while the total is below MaxEntries (compare-and-swap), else takes over
// the slot of the entry it evicts: in place, under its own model's lock, when that entry is
// its own model's; otherwise it removes the entry under the other model's lock first, keeps
// the slot that frees, and then adds its key under its own. Entries are removed before the
// total is lowered, so entries ≤ total ≤ MaxEntries. A Set holds one model lock at a time,
// so models need no lock order.
//
// Eviction is least recently used across the whole store, so every model keeps entries in
// proportion to its recent use, whichever filled the store first. Each model's list is in
// access-time order, so the store's least recently used entry is the tail of one of them.
// Each model mirrors its tail's access time in an atomic, written under its lock when the
// tail changes (rarely, on the common paths), so a Set at a full store compares its own
// tail with the other models' mirrors (the models are the few a worker serves) without
// taking their locks. While other Sets run, a mirror can be a moment old, so the entry
// evicted may not be exactly the oldest; the capacity stays exact.
//
// Expired entries are dropped lazily (a Get of an expired entry is a miss and removes it), by
// Sweep, and first when a full store needs room, as the least recently used entry is the
// oldest. Time is read from the monotonic clock; an injected clock that runs backwards makes
// entries live longer, never shorter.
type Memory struct {
	opts MemoryOptions
	ttl  int64 // nanoseconds
	max  int64 // opts.MaxEntries
	// total is the number of entries across all models plus the slots claimed by Sets in
	// progress; it never exceeds max.
	total atomic.Int64
	// epoch is the clock reading at creation; access times are nanoseconds since it, which
	// uses the monotonic clock when Now is time.Now, so wall-clock steps do not expire or
	// revive sessions.
	epoch  time.Time
	models sync.Map // model name → *modelSessions
	// list holds every model in creation order, to find the store's oldest entry; it is
	// replaced, never modified, under listMu when a model is created. Models are never removed.
	listMu sync.Mutex
	list   atomic.Pointer[[]*modelSessions]
}

var _ Store = (*Memory)(nil)

// NewMemory returns an empty store; see MemoryOptions for the defaults.
func NewMemory(opts MemoryOptions) *Memory {
	opts.ApplyDefaults()
	m := &Memory{opts: opts, ttl: int64(opts.TTL), max: int64(opts.MaxEntries), epoch: opts.Now()}
	m.list.Store(new([]*modelSessions))
	return m
}

func (m *Memory) now() int64 { return int64(m.opts.Now().Sub(m.epoch)) }

func (m *Memory) expired(lastUsed, now int64) bool { return now-lastUsed >= m.ttl }

// evictReason is what evicting an entry last used at lastUsed is reported as.
func (m *Memory) evictReason(lastUsed, now int64) EvictReason {
	if m.expired(lastUsed, now) {
		return SessionTTL
	}
	return SessionCapacity
}

// claim takes a slot of the total if the store is below capacity.
func (m *Memory) claim() bool {
	for {
		n := m.total.Load()
		if n >= m.max {
			return false
		}
		if m.total.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// release gives back the slots of n entries that were removed.
func (m *Memory) release(n int) {
	if n > 0 {
		m.total.Add(-int64(n))
	}
}

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
	m.listMu.Lock()
	defer m.listMu.Unlock()
	if ms := m.lookup(model); ms != nil {
		return ms
	}
	ms := newModelSessions(strings.Clone(model))
	list := append(slices.Clone(*m.list.Load()), ms)
	m.list.Store(&list) // before the model can hold an entry, so every Set sees it
	m.models.Store(ms.name, ms)
	return ms
}

// Get returns the tenant for key and refreshes the entry. An expired entry is removed and
// reported as a miss.
func (m *Memory) Get(_ context.Context, model, key string) (tenant.ID, bool, error) {
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
		m.release(1)
		m.report(model, SessionTTL, 1)
		return "", false, nil
	}
	e.lastUsed = now
	ms.moveToFrontLocked(i)
	worker := ms.tenants.names[e.tenant]
	ms.mu.Unlock()
	return worker, true, nil
}

// Set points key at tenant and makes it the most recently used entry. Adding a key to a full
// store evicts the store's least recently used entry, of whichever model, and reports it
// under the model it belonged to: SessionTTL if it had expired anyway, else SessionCapacity.
func (m *Memory) Set(_ context.Context, model, key string, worker tenant.ID) error {
	ms := m.lookupOrCreate(model)
	claimed := false // a slot of the total freed in another model for this Set
	for {
		ms.mu.Lock()
		now := m.now() // read under the lock, so list order is access-time order
		if i, ok := ms.index[key]; ok {
			e := &ms.entries[i]
			if ms.tenants.names[e.tenant] != worker {
				ms.tenants.release(e.tenant)
				e.tenant = ms.tenants.acquire(worker)
			}
			e.lastUsed = now
			ms.moveToFrontLocked(i)
			ms.mu.Unlock()
			if claimed { // another Set added the key while this one made room
				m.release(1)
			}
			return nil
		}
		if claimed || m.claim() {
			ms.addLocked(strings.Clone(key), ms.tenants.acquire(worker), now)
			ms.mu.Unlock()
			return nil
		}
		// The store is full: evict its least recently used entry.
		victim := m.oldestModel(ms)
		if victim == ms {
			// The new entry takes over the slot of this model's own entry, and the total
			// does not change.
			reason := m.evictReason(ms.entries[ms.tail].lastUsed, now)
			ms.removeLocked(ms.tail)
			ms.addLocked(strings.Clone(key), ms.tenants.acquire(worker), now)
			ms.mu.Unlock()
			m.report(model, reason, 1)
			return nil
		}
		ms.mu.Unlock()
		// Another model's: evict it under that model's lock, with this one's released, and
		// add the key with the slot it frees.
		if victim != nil && m.evictTail(victim, now) {
			claimed = true
			continue
		}
		// No model holds an entry, or the chosen one emptied meanwhile: the slots are
		// claimed by Sets in progress or are being released by removals, which finish
		// without waiting for this one. Let them, then try again.
		runtime.Gosched()
	}
}

// oldestModel returns the model whose least recently used entry is the oldest in the store,
// or nil if no model holds an entry. The caller holds self's lock; the other models' oldest
// access times are read from their mirrors, without their locks. Ties go to self, whose
// entry is the cheaper to evict, then to the model created first.
func (m *Memory) oldestModel(self *modelSessions) *modelSessions {
	var victim *modelSessions
	oldest := int64(math.MaxInt64)
	if self.tail != none {
		victim, oldest = self, self.entries[self.tail].lastUsed
	}
	for _, ms := range *m.list.Load() {
		if t := ms.oldest.Load(); ms != self && t < oldest {
			victim, oldest = ms, t
		}
	}
	return victim
}

// evictTail evicts the least recently used entry of ms and reports whether there was one; the
// entry's slot of the total passes to the caller. now is the caller's last clock reading,
// moments old, which is close enough to tell whether the entry had expired and saves a
// reading of the clock.
func (m *Memory) evictTail(ms *modelSessions, now int64) bool {
	ms.mu.Lock()
	if ms.tail == none {
		ms.mu.Unlock()
		return false
	}
	reason := m.evictReason(ms.entries[ms.tail].lastUsed, now)
	ms.removeLocked(ms.tail)
	ms.mu.Unlock()
	m.report(ms.name, reason, 1)
	return true
}

// Delete removes key from model, if present.
func (m *Memory) Delete(_ context.Context, model, key string) error {
	ms := m.lookup(model)
	if ms == nil {
		return nil
	}
	ms.mu.Lock()
	i, ok := ms.index[key]
	if ok {
		ms.removeLocked(i)
	}
	ms.mu.Unlock()
	if ok {
		m.release(1)
	}
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
		m.release(removed)
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
	return int(ms.size.Load())
}

// Counts returns the number of entries held for each model that has any. The counts are
// read one model at a time, so while writers run they need not add up to Total.
func (m *Memory) Counts() map[string]int {
	out := map[string]int{}
	m.models.Range(func(model, value any) bool {
		if n := value.(*modelSessions).size.Load(); n > 0 {
			out[model.(string)] = int(n)
		}
		return true
	})
	return out
}

// Total returns the number of entries held across all models, including expired ones not yet
// dropped; it is at most MaxEntries. While Sets run it also counts the entries they are about
// to add; once they return it is the sum of Len over all models.
func (m *Memory) Total() int { return int(m.total.Load()) }

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
			m.release(batch)
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
