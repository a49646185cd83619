package session

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

const (
	model   = "llama-3-8b"
	workerA = "http://10.0.0.1:8000"
	workerB = "http://10.0.0.2:8000"
)

// evictLog records OnEvict calls as totals per model and reason.
type evictLog struct {
	mu     sync.Mutex
	counts map[string]int
}

func (l *evictLog) record(model string, reason EvictReason, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.counts == nil {
		l.counts = map[string]int{}
	}
	l.counts[model+"/"+reason.String()] += n
}

func (l *evictLog) count(model string, reason EvictReason) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.counts[model+"/"+reason.String()]
}

var ctx = context.Background()

func set(t *testing.T, s Store, model, key string, worker tenant.ID) {
	t.Helper()
	if err := s.Set(ctx, model, key, worker); err != nil {
		t.Fatalf("Set(%q, %q, %q): %v", model, key, worker, err)
	}
}

func assertGet(t *testing.T, s Store, model, key string, wantTenant tenant.ID) {
	t.Helper()
	worker, ok, err := s.Get(ctx, model, key)
	if err != nil {
		t.Fatalf("Get(%q, %q): %v", model, key, err)
	}
	wantOK := wantTenant != ""
	if ok != wantOK || worker != wantTenant {
		t.Fatalf("Get(%q, %q) = (%q, %v), want (%q, %v)", model, key, worker, ok, wantTenant, wantOK)
	}
}

func TestMemory_SetThenGetReturnsTheTenant(t *testing.T) {
	m := NewMemory(MemoryOptions{})
	set(t, m, model, "s1", workerA)
	assertGet(t, m, model, "s1", workerA)
	assertGet(t, m, model, "s2", "")
	assertGet(t, m, "other-model", "s1", "")
}

func TestMemory_OverwriteMovesTheSessionToAnotherTenant(t *testing.T) {
	m := NewMemory(MemoryOptions{})
	set(t, m, model, "s1", workerA)
	set(t, m, model, "s1", workerB)
	assertGet(t, m, model, "s1", workerB)
	if n := m.Len(model); n != 1 {
		t.Fatalf("Len = %d after overwrite, want 1", n)
	}
}

func TestMemory_DeleteRemovesTheSession(t *testing.T) {
	m := NewMemory(MemoryOptions{})
	set(t, m, model, "s1", workerA)
	if err := m.Delete(ctx, model, "s1"); err != nil {
		t.Fatal(err)
	}
	assertGet(t, m, model, "s1", "")
	if err := m.Delete(ctx, "never-seen", "s1"); err != nil {
		t.Fatal(err)
	}
}

func TestTTL_ExpiryDropsOldEntriesAndKeepsTheNewest(t *testing.T) {
	clock := testkit.NewClock()
	var log evictLog
	m := NewMemory(MemoryOptions{TTL: time.Minute, Now: clock.Now, OnEvict: log.record})
	set(t, m, model, "old", workerA)
	clock.Advance(40 * time.Second)
	set(t, m, model, "new", workerB)
	clock.Advance(30 * time.Second) // old: 70s idle, new: 30s

	assertGet(t, m, model, "old", "")
	assertGet(t, m, model, "new", workerB)
	if n := m.Len(model); n != 1 {
		t.Fatalf("expired entry was not removed by Get: Len = %d", n)
	}
	if n := log.count(model, SessionTTL); n != 1 {
		t.Fatalf("OnEvict(SessionTTL) total = %d, want 1", n)
	}
}

func TestTTL_GetRefreshesTheTTL(t *testing.T) {
	clock := testkit.NewClock()
	m := NewMemory(MemoryOptions{TTL: time.Minute, Now: clock.Now})
	set(t, m, model, "s1", workerA)
	for range 5 {
		clock.Advance(50 * time.Second)
		assertGet(t, m, model, "s1", workerA)
	}
	clock.Advance(time.Minute)
	assertGet(t, m, model, "s1", "")
}

func TestTTL_SweepDropsOnlyExpiredEntriesInEveryModel(t *testing.T) {
	clock := testkit.NewClock()
	var log evictLog
	m := NewMemory(MemoryOptions{TTL: time.Minute, Now: clock.Now, OnEvict: log.record})
	for i := range 3000 { // more than one sweep batch
		set(t, m, model, fmt.Sprintf("old-%d", i), workerA)
	}
	set(t, m, "other-model", "old", workerA)
	clock.Advance(50 * time.Second)
	set(t, m, model, "fresh", workerB)
	clock.Advance(20 * time.Second)

	if n := m.Sweep(); n != 3001 {
		t.Fatalf("Sweep dropped %d, want 3001", n)
	}
	if m.Len(model) != 1 || m.Len("other-model") != 0 {
		t.Fatalf("after Sweep: Len = %d and %d, want 1 and 0", m.Len(model), m.Len("other-model"))
	}
	assertGet(t, m, model, "fresh", workerB)
	if a, b := log.count(model, SessionTTL), log.count("other-model", SessionTTL); a != 3000 || b != 1 {
		t.Fatalf("OnEvict(SessionTTL) = %d and %d, want 3000 and 1", a, b)
	}
}

func TestCapacity_EvictsTheLeastRecentlyUsedAndKeepsTheNewest(t *testing.T) {
	var log evictLog
	m := NewMemory(MemoryOptions{MaxEntries: 3, OnEvict: log.record})
	for _, key := range []string{"s1", "s2", "s3", "s4", "s5"} {
		set(t, m, model, key, workerA)
	}
	if n := m.Len(model); n != 3 {
		t.Fatalf("Len = %d, want the capacity 3", n)
	}
	assertGet(t, m, model, "s1", "")
	assertGet(t, m, model, "s2", "")
	for _, key := range []string{"s3", "s4", "s5"} {
		assertGet(t, m, model, key, workerA)
	}
	if n := log.count(model, SessionCapacity); n != 2 {
		t.Fatalf("OnEvict(SessionCapacity) total = %d, want 2", n)
	}
}

func TestCapacity_GetRefreshesRecency(t *testing.T) {
	m := NewMemory(MemoryOptions{MaxEntries: 3})
	set(t, m, model, "s1", workerA)
	set(t, m, model, "s2", workerA)
	set(t, m, model, "s3", workerA)
	assertGet(t, m, model, "s1", workerA) // s1 is now the most recent; s2 the least
	set(t, m, model, "s4", workerB)

	assertGet(t, m, model, "s2", "")
	assertGet(t, m, model, "s1", workerA)
	assertGet(t, m, model, "s3", workerA)
	assertGet(t, m, model, "s4", workerB)
}

func TestCapacity_OverwriteRefreshesRecency(t *testing.T) {
	m := NewMemory(MemoryOptions{MaxEntries: 2})
	set(t, m, model, "s1", workerA)
	set(t, m, model, "s2", workerA)
	set(t, m, model, "s1", workerB)
	set(t, m, model, "s3", workerA)
	assertGet(t, m, model, "s2", "")
	assertGet(t, m, model, "s1", workerB)
}

func TestCapacity_ExpiredVictimIsReportedAsTTL(t *testing.T) {
	clock := testkit.NewClock()
	var log evictLog
	m := NewMemory(MemoryOptions{MaxEntries: 2, TTL: time.Minute, Now: clock.Now, OnEvict: log.record})
	set(t, m, model, "s1", workerA)
	set(t, m, model, "s2", workerA)
	clock.Advance(2 * time.Minute)
	set(t, m, model, "s3", workerA)
	if ttl, capacity := log.count(model, SessionTTL), log.count(model, SessionCapacity); ttl != 1 || capacity != 0 {
		t.Fatalf("OnEvict: %d SessionTTL, %d SessionCapacity; want 1 and 0", ttl, capacity)
	}
}

func TestModels_AreIsolated(t *testing.T) {
	m := NewMemory(MemoryOptions{})
	set(t, m, "m1", "s1", workerA)
	set(t, m, "m2", "s1", workerB)
	assertGet(t, m, "m1", "s1", workerA)
	assertGet(t, m, "m2", "s1", workerB)
	if err := m.Delete(ctx, "m1", "s1"); err != nil {
		t.Fatal(err)
	}
	assertGet(t, m, "m1", "s1", "")
	assertGet(t, m, "m2", "s1", workerB)
}

func TestRemoveTenantsWithBase_RemovesWorkerAndItsRanksOnly(t *testing.T) {
	const url = "http://10.0.0.1:8000"
	var log evictLog
	m := NewMemory(MemoryOptions{OnEvict: log.record})
	removed := []tenant.ID{url, url + "@0", url + "@1", url + "@12"}
	kept := []tenant.ID{url + "2", url + "x@0", url + "@", url + "@r1", workerB}
	for _, mdl := range []string{"m1", "m2"} {
		for _, tenant := range append(append([]tenant.ID{}, removed...), kept...) {
			set(t, m, mdl, "session-on-"+string(tenant), tenant)
		}
	}
	if err := m.RemoveTenantsWithBase(ctx, url); err != nil {
		t.Fatal(err)
	}
	for _, mdl := range []string{"m1", "m2"} {
		for _, tenant := range removed {
			assertGet(t, m, mdl, "session-on-"+string(tenant), "")
		}
		for _, tenant := range kept {
			assertGet(t, m, mdl, "session-on-"+string(tenant), tenant)
		}
		if n := log.count(mdl, WorkerRemoved); n != len(removed) {
			t.Fatalf("OnEvict(%q, WorkerRemoved) total = %d, want %d", mdl, n, len(removed))
		}
	}
}

func TestTenantIDs_AreFreedAndReused(t *testing.T) {
	m := NewMemory(MemoryOptions{})
	set(t, m, model, "s1", workerA)
	set(t, m, model, "s1", workerB) // workerA is no longer referenced
	set(t, m, model, "s2", "http://10.0.0.3:8000")
	ms := m.lookup(model)
	if len(ms.tenants.names) != 2 || len(ms.tenants.ids) != 2 {
		t.Fatalf("tenant table holds %d names, %d ids; want 2 and 2", len(ms.tenants.names), len(ms.tenants.ids))
	}
	assertGet(t, m, model, "s1", workerB)
	assertGet(t, m, model, "s2", "http://10.0.0.3:8000")
}

func TestOptions_ApplyDefaults(t *testing.T) {
	var o MemoryOptions
	o.ApplyDefaults()
	if o.TTL != time.Hour || o.MaxEntries != 1<<20 || o.Now == nil {
		t.Fatalf("defaults: TTL %v, MaxEntries %d, Now set %v", o.TTL, o.MaxEntries, o.Now != nil)
	}
}

func TestEvictReason_String(t *testing.T) {
	for reason, want := range map[EvictReason]string{
		SessionTTL: "session_ttl", SessionCapacity: "session_capacity", WorkerRemoved: "worker_removed", 0: "unknown",
	} {
		if got := reason.String(); got != want {
			t.Errorf("%d.String() = %q, want %q", int(reason), got, want)
		}
	}
}

// TestMemory_MatchesAReferenceUnderRandomOperations runs random operations against Memory
// and a plain map with explicit recency, checking every Get and the list structure.
func TestMemory_MatchesAReferenceUnderRandomOperations(t *testing.T) {
	const capacity = 20
	clock := testkit.NewClock()
	m := NewMemory(MemoryOptions{MaxEntries: capacity, TTL: 100 * time.Second, Now: clock.Now})
	type refEntry struct {
		tenant tenant.ID
		last   time.Time
	}
	ref := map[string]refEntry{}
	refEvictOldest := func() {
		oldest := ""
		for k, e := range ref {
			if oldest == "" || e.last.Before(ref[oldest].last) {
				oldest = k
			}
		}
		delete(ref, oldest)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	tenants := []tenant.ID{workerA, workerA + "@1", workerB}
	for range 20000 {
		clock.Advance(time.Duration(1+rng.IntN(3)) * time.Second) // distinct, increasing times
		key := fmt.Sprintf("s%d", rng.IntN(40))
		switch op := rng.IntN(10); {
		case op < 4:
			tenant := tenants[rng.IntN(len(tenants))]
			set(t, m, model, key, tenant)
			if _, ok := ref[key]; !ok && len(ref) == capacity {
				refEvictOldest()
			}
			ref[key] = refEntry{tenant, clock.Now()}
		case op < 8:
			want, ok := ref[key]
			if ok && clock.Now().Sub(want.last) >= 100*time.Second {
				delete(ref, key)
				ok = false
			}
			if ok {
				want.last = clock.Now()
				ref[key] = want
				assertGet(t, m, model, key, want.tenant)
			} else {
				assertGet(t, m, model, key, "")
			}
		case op < 9:
			_ = m.Delete(ctx, model, key)
			delete(ref, key)
		default:
			_ = m.RemoveTenantsWithBase(ctx, workerA)
			for k, e := range ref {
				if tenant.HasBase(string(e.tenant), workerA) {
					delete(ref, k)
				}
			}
		}
		if ms := m.lookup(model); ms != nil {
			checkList(t, ms)
		}
	}
}

// checkList verifies the index, the list links and the recency order of one model.
func checkList(t *testing.T, ms *modelSessions) {
	t.Helper()
	ms.mu.Lock()
	defer ms.mu.Unlock()
	n, prev := 0, none
	for i := ms.head; i != none; i = ms.entries[i].next {
		e := ms.entries[i]
		if e.prev != prev {
			t.Fatalf("entry %q links back to %d, want %d", e.key, e.prev, prev)
		}
		if prev != none && ms.entries[prev].lastUsed < e.lastUsed {
			t.Fatalf("entry %q is more recent than its predecessor", e.key)
		}
		if ms.index[e.key] != i {
			t.Fatalf("entry %q is at %d but indexed at %d", e.key, i, ms.index[e.key])
		}
		prev = i
		n++
	}
	if prev != ms.tail || n != len(ms.index) {
		t.Fatalf("list of %d entries ending at %d; index has %d, tail %d", n, prev, len(ms.index), ms.tail)
	}
	if size := ms.size.Load(); int(size) != n {
		t.Fatalf("size is %d, the list holds %d entries", size, n)
	}
	want := int64(math.MaxInt64)
	if ms.tail != none {
		want = ms.entries[ms.tail].lastUsed
	}
	if got := ms.oldest.Load(); got != want {
		t.Fatalf("oldest is %d, the tail was last used at %d", got, want)
	}
}

func TestConcurrent_GetSetAcrossModels(t *testing.T) {
	m := NewMemory(MemoryOptions{MaxEntries: 500, TTL: time.Second})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			for range 5000 {
				mdl := fmt.Sprintf("m%d", rng.IntN(3))
				key := fmt.Sprintf("s%d", rng.IntN(1000))
				switch rng.IntN(20) {
				case 0:
					_ = m.RemoveTenantsWithBase(ctx, workerA)
				case 1:
					m.Sweep()
				case 2:
					_ = m.Delete(ctx, mdl, key)
				case 3, 4, 5, 6, 7:
					_ = m.Set(ctx, mdl, key, []tenant.ID{workerA, workerA + "@1", workerB}[rng.IntN(3)])
				default:
					if tenant, ok, _ := m.Get(ctx, mdl, key); ok && tenant == "" {
						t.Errorf("hit with an empty tenant")
					}
				}
			}
		})
	}
	wg.Wait()
	sum := 0
	for _, mdl := range []string{"m0", "m1", "m2"} {
		if ms := m.lookup(mdl); ms != nil {
			checkList(t, ms)
			sum += len(ms.index)
		}
	}
	if sum > 500 || m.Total() != sum {
		t.Fatalf("models hold %d entries, Total %d; want them equal and at most 500", sum, m.Total())
	}
}
