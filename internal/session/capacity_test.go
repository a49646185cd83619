package session

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// MaxEntries bounds the whole store: these tests hold it to that, alone and under concurrency.

func TestCapacity_BoundsAllModelsTogether(t *testing.T) {
	clock := testkit.NewClock()
	m := NewMemory(MemoryOptions{MaxEntries: 4, Now: clock.Now})
	for i := range 10 {
		set(t, m, fmt.Sprintf("m%d", i%3), fmt.Sprintf("s%d", i), workerA)
		clock.Advance(time.Second)
		if want := min(i+1, 4); m.Total() != want {
			t.Fatalf("after %d new keys: Total = %d, want %d", i+1, m.Total(), want)
		}
	}
	if c := m.Counts(); c["m0"]+c["m1"]+c["m2"] != 4 {
		t.Fatalf("Counts = %v, want 4 entries in all", c)
	}
}

func TestCapacity_EvictsTheLeastRecentlyUsedEntryOfWhicheverModel(t *testing.T) {
	clock := testkit.NewClock()
	var log evictLog
	m := NewMemory(MemoryOptions{MaxEntries: 4, Now: clock.Now, OnEvict: log.record})
	tick := func() { clock.Advance(time.Second) }
	for _, key := range []string{"a1", "a2", "a3"} {
		set(t, m, "m1", key, workerA)
		tick()
	}
	set(t, m, "m2", "b1", workerA)
	tick()

	// The store is full: m2's new key evicts a1, the oldest entry in the store, from m1.
	set(t, m, "m2", "b2", workerB)
	tick()
	assertGet(t, m, "m1", "a1", "")
	if m.Len("m1") != 2 || m.Len("m2") != 2 || m.Total() != 4 {
		t.Fatalf("Len = %d and %d, Total %d; want 2, 2 and 4", m.Len("m1"), m.Len("m2"), m.Total())
	}
	if a, b := log.count("m1", SessionCapacity), log.count("m2", SessionCapacity); a != 1 || b != 0 {
		t.Fatalf("OnEvict(SessionCapacity): m1 %d, m2 %d; want 1 and 0 (reported under the model that lost it)", a, b)
	}

	// A read is use: a2 is refreshed, so m1's next key evicts m1's own a3 instead.
	assertGet(t, m, "m1", "a2", workerA)
	tick()
	set(t, m, "m1", "a4", workerA)
	tick()
	assertGet(t, m, "m1", "a3", "")
	assertGet(t, m, "m2", "b1", workerA)
	tick()

	// Now m2's b2 is the oldest, and m1's next key evicts it.
	set(t, m, "m1", "a5", workerA)
	assertGet(t, m, "m2", "b2", "")
	if c := m.Counts(); c["m1"] != 3 || c["m2"] != 1 || m.Total() != 4 {
		t.Fatalf("Counts = %v, Total %d; want m1:3 m2:1 and 4", c, m.Total())
	}
	if a, b := log.count("m1", SessionCapacity), log.count("m2", SessionCapacity); a != 2 || b != 1 {
		t.Fatalf("OnEvict(SessionCapacity): m1 %d, m2 %d; want 2 and 1", a, b)
	}
}

func TestCapacity_ANewModelEvictsTheOldestEntryNotFromTheLargestModel(t *testing.T) {
	clock := testkit.NewClock()
	var log evictLog
	m := NewMemory(MemoryOptions{MaxEntries: 4, TTL: time.Minute, Now: clock.Now, OnEvict: log.record})
	set(t, m, "m2", "b1", workerA)
	for _, key := range []string{"a1", "a2", "a3"} {
		clock.Advance(time.Second)
		set(t, m, "m1", key, workerA)
	}
	clock.Advance(time.Second)

	set(t, m, "m3", "c1", workerB)
	assertGet(t, m, "m2", "b1", "")
	assertGet(t, m, "m3", "c1", workerB)
	if c := m.Counts(); c["m1"] != 3 || c["m2"] != 0 || c["m3"] != 1 || m.Total() != 4 {
		t.Fatalf("Counts = %v, Total %d; want m1:3 m3:1 and 4", c, m.Total())
	}
	if n := log.count("m2", SessionCapacity); n != 1 {
		t.Fatalf("OnEvict(m2, SessionCapacity) total = %d, want 1", n)
	}

	// An evicted entry that had expired anyway is reported as SessionTTL: a1 is the oldest.
	clock.Advance(2 * time.Minute)
	set(t, m, "m4", "d1", workerB)
	assertGet(t, m, "m4", "d1", workerB)
	if c := m.Counts(); c["m1"] != 2 || c["m3"] != 1 || c["m4"] != 1 || m.Total() != 4 {
		t.Fatalf("Counts = %v, Total %d; want m1:2 m3:1 m4:1 and 4", c, m.Total())
	}
	if ttl, capacity := log.count("m1", SessionTTL), log.count("m1", SessionCapacity); ttl != 1 || capacity != 0 {
		t.Fatalf("OnEvict(m1): %d SessionTTL, %d SessionCapacity; want 1 and 0", ttl, capacity)
	}
}

func TestCapacity_OnEqualAccessTimesTheAddingModelsOwnEntryGoes(t *testing.T) {
	clock := testkit.NewClock() // never advanced: every entry has the same access time
	var log evictLog
	m := NewMemory(MemoryOptions{MaxEntries: 3, Now: clock.Now, OnEvict: log.record})
	set(t, m, "m1", "a1", workerA)
	set(t, m, "m2", "b1", workerA)
	set(t, m, "m3", "c1", workerA)

	set(t, m, "m3", "c2", workerB)
	assertGet(t, m, "m3", "c1", "")
	// A model holding none evicts from the model created first.
	set(t, m, "m4", "d1", workerB)
	assertGet(t, m, "m1", "a1", "")
	if c := m.Counts(); c["m2"] != 1 || c["m3"] != 1 || c["m4"] != 1 {
		t.Fatalf("Counts = %v, want m2:1 m3:1 m4:1", c)
	}
	if a, c := log.count("m1", SessionCapacity), log.count("m3", SessionCapacity); a != 1 || c != 1 {
		t.Fatalf("OnEvict(SessionCapacity): m1 %d, m3 %d; want 1 and 1", a, c)
	}
}

// TestCapacity_ModelsShareAFullStoreInProportionToTheirUse: a model that arrives at a store
// another model filled is not held to one entry; every model keeps the share of the store
// that its recent new keys make up.
func TestCapacity_ModelsShareAFullStoreInProportionToTheirUse(t *testing.T) {
	const capacity = 100
	clock := testkit.NewClock()
	m := NewMemory(MemoryOptions{MaxEntries: capacity, Now: clock.Now})
	n := 0
	add := func(mdl string) {
		set(t, m, mdl, fmt.Sprintf("s%d", n), workerA)
		n++
		clock.Advance(time.Millisecond)
	}
	for range capacity {
		add("busy")
	}

	// Alternating new keys: after a store's worth of them, each model holds half.
	for i := range capacity {
		add([]string{"busy", "quiet"}[i%2])
	}
	if c := m.Counts(); c["busy"] != capacity/2 || c["quiet"] != capacity/2 || m.Total() != capacity {
		t.Fatalf("after alternating inserts: Counts = %v, Total %d; want %d each", c, m.Total(), capacity/2)
	}

	// One new key in four for quiet: it ends with a quarter of the store.
	for i := range 2 * capacity {
		if i%4 == 3 {
			add("quiet")
		} else {
			add("busy")
		}
	}
	if c := m.Counts(); c["busy"] != 3*capacity/4 || c["quiet"] != capacity/4 || m.Total() != capacity {
		t.Fatalf("after 3:1 inserts: Counts = %v, Total %d; want busy:%d quiet:%d", c, m.Total(), 3*capacity/4, capacity/4)
	}

	// A model that is read keeps its entries even while another adds keys: quiet reads its
	// 25 sessions between busy's new keys and loses none of them.
	quiet := m.lookup("quiet")
	var keys []string
	quiet.mu.Lock()
	for key := range quiet.index {
		keys = append(keys, key)
	}
	quiet.mu.Unlock()
	for i := range 4 * capacity {
		if i%4 == 0 {
			for _, key := range keys {
				assertGet(t, m, "quiet", key, workerA)
			}
			clock.Advance(time.Millisecond)
		}
		add("busy")
	}
	if c := m.Counts(); c["quiet"] != capacity/4 || c["busy"] != 3*capacity/4 {
		t.Fatalf("while quiet reads its sessions: Counts = %v, want busy:%d quiet:%d", c, 3*capacity/4, capacity/4)
	}
}

func TestCapacity_RoomFreedInOneModelIsUsedByAnother(t *testing.T) {
	var log evictLog
	m := NewMemory(MemoryOptions{MaxEntries: 3, OnEvict: log.record})
	for _, key := range []string{"a1", "a2", "a3"} {
		set(t, m, "m1", key, workerA)
	}
	if err := m.Delete(ctx, "m1", "a1"); err != nil {
		t.Fatal(err)
	}
	if err := m.RemoveTenantsWithBase(ctx, workerA); err != nil {
		t.Fatal(err)
	}
	if m.Total() != 0 {
		t.Fatalf("Total = %d after removing every entry, want 0", m.Total())
	}
	for _, key := range []string{"b1", "b2", "b3"} {
		set(t, m, "m2", key, workerB)
	}
	if m.Len("m2") != 3 || m.Total() != 3 || log.count("m2", SessionCapacity) != 0 {
		t.Fatalf("Len(m2) = %d, Total %d, %d evicted; want 3, 3 and 0",
			m.Len("m2"), m.Total(), log.count("m2", SessionCapacity))
	}
}

// heldEntries locks every model of m at once and returns the entries they hold together: a
// consistent view while writers run. Memory never holds two model locks, so any order is safe.
// Models created after the call starts are not counted.
func heldEntries(m *Memory) int {
	var all []*modelSessions
	m.models.Range(func(_, value any) bool {
		all = append(all, value.(*modelSessions))
		return true
	})
	for _, ms := range all {
		ms.mu.Lock()
	}
	n := 0
	for _, ms := range all {
		n += len(ms.index)
	}
	for _, ms := range all {
		ms.mu.Unlock()
	}
	return n
}

// TestConcurrent_CapacityHoldsAcrossModelsAtEveryMoment runs writers over several models,
// with every operation and TTL expiry in the mix, while a monitor checks that the models hold
// at most MaxEntries together at every moment it looks (exactly: no tolerance). Once the
// writers stop, Total must equal the sum of the models' lengths. Capacity 1 makes almost every
// new key in an empty model evict from another one.
func TestConcurrent_CapacityHoldsAcrossModelsAtEveryMoment(t *testing.T) {
	models := []string{"m0", "m1", "m2", "m3", "m4", "m5"}
	tenants := []tenant.ID{workerA, workerA + "@1", workerB}
	for _, capacity := range []int{1, 7, 200} {
		t.Run(fmt.Sprintf("capacity=%d", capacity), func(t *testing.T) {
			clock := testkit.NewClock()
			m := NewMemory(MemoryOptions{MaxEntries: capacity, TTL: 30 * time.Second, Now: clock.Now})
			for _, mdl := range models {
				m.lookupOrCreate(mdl) // so that the monitor sees every model
			}
			check := func() {
				if n, total := heldEntries(m), m.Total(); n > capacity || total > capacity {
					t.Errorf("models hold %d entries, Total %d; capacity %d", n, total, capacity)
				}
			}
			stop := make(chan struct{})
			var monitor, writers sync.WaitGroup
			snapshots := 0
			monitor.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
					}
					check()
					snapshots++
					runtime.Gosched()
				}
			})
			for g := range len(models) {
				writers.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(g), uint64(capacity)))
					for range 3000 {
						mdl := models[g]
						if rng.IntN(2) == 0 {
							mdl = models[rng.IntN(len(models))]
						}
						key := fmt.Sprintf("s%d", rng.IntN(400))
						switch op := rng.IntN(100); {
						case op < 2:
							_ = m.RemoveTenantsWithBase(ctx, workerA)
						case op < 4:
							m.Sweep()
						case op < 6:
							clock.Advance(time.Second)
						case op < 16:
							_ = m.Delete(ctx, mdl, key)
						case op < 40:
							_, _, _ = m.Get(ctx, mdl, key)
						default:
							_ = m.Set(ctx, mdl, key, tenants[rng.IntN(len(tenants))])
						}
					}
				})
			}
			writers.Wait()
			close(stop)
			monitor.Wait()
			t.Logf("%d snapshots taken while writers ran", snapshots)

			check()
			for _, mdl := range models {
				checkList(t, m.lookup(mdl))
			}
			sum := 0
			for _, n := range m.Counts() {
				sum += n
			}
			if n := heldEntries(m); m.Total() != sum || n != sum {
				t.Fatalf("Total %d, Counts add up to %d, models hold %d; want all equal", m.Total(), sum, n)
			}
		})
	}
}

// TestMemory_MatchesAReferenceAcrossModels runs random operations on four models sharing one
// capacity against a plain reference, checking every Get, every OnEvict report (model and
// reason), every model's length and Total after each operation. The reference evicts the
// entry with the oldest access time in the whole store.
func TestMemory_MatchesAReferenceAcrossModels(t *testing.T) {
	const (
		capacity = 6
		ttl      = 100 * time.Second
	)
	clock := testkit.NewClock()
	var events []string
	m := NewMemory(MemoryOptions{MaxEntries: capacity, TTL: ttl, Now: clock.Now,
		OnEvict: func(model string, reason EvictReason, n int) {
			for range n {
				events = append(events, model+"/"+reason.String())
			}
		}})
	type refEntry struct {
		tenant tenant.ID
		last   time.Time
	}
	models := []string{"m0", "m1", "m2", "m3"}
	ref := map[string]map[string]refEntry{}
	for _, mdl := range models {
		ref[mdl] = map[string]refEntry{}
	}
	refTotal := func() int {
		n := 0
		for _, entries := range ref {
			n += len(entries)
		}
		return n
	}
	expired := func(e refEntry) bool { return clock.Now().Sub(e.last) >= ttl }
	reasonFor := func(e refEntry) EvictReason {
		if expired(e) {
			return SessionTTL
		}
		return SessionCapacity
	}
	// oldest returns the entry of the whole store with the oldest access time; access times
	// are distinct, as the clock advances before every operation.
	oldest := func() (mdl, key string) {
		for _, other := range models {
			for k, e := range ref[other] {
				if key == "" || e.last.Before(ref[mdl][key].last) {
					mdl, key = other, k
				}
			}
		}
		return mdl, key
	}
	rng := rand.New(rand.NewPCG(2, 2))
	tenants := []tenant.ID{workerA, workerA + "@1", workerB}
	fromOtherModel, fromOwnModel := 0, 0
	for step := range 20000 {
		clock.Advance(time.Duration(1+rng.IntN(3)) * time.Second) // distinct, increasing times
		mdl := models[rng.IntN(len(models))]
		key := fmt.Sprintf("s%d", rng.IntN(15))
		events = events[:0]
		var want []string
		switch op := rng.IntN(20); {
		case op < 8:
			tenant := tenants[rng.IntN(len(tenants))]
			if _, exists := ref[mdl][key]; !exists && refTotal() == capacity {
				victim, k := oldest()
				if victim == mdl {
					fromOwnModel++
				} else {
					fromOtherModel++
				}
				want = append(want, victim+"/"+reasonFor(ref[victim][k]).String())
				delete(ref[victim], k)
			}
			set(t, m, mdl, key, tenant)
			ref[mdl][key] = refEntry{tenant, clock.Now()}
		case op < 15:
			e, ok := ref[mdl][key]
			if ok && expired(e) {
				want = append(want, mdl+"/"+SessionTTL.String())
				delete(ref[mdl], key)
				ok = false
			}
			if ok {
				e.last = clock.Now()
				ref[mdl][key] = e
				assertGet(t, m, mdl, key, e.tenant)
			} else {
				assertGet(t, m, mdl, key, "")
			}
		case op < 18:
			_ = m.Delete(ctx, mdl, key)
			delete(ref[mdl], key)
		case op < 19:
			_ = m.RemoveTenantsWithBase(ctx, workerA)
			for _, other := range models {
				for k, e := range ref[other] {
					if tenant.HasBase(string(e.tenant), workerA) {
						want = append(want, other+"/"+WorkerRemoved.String())
						delete(ref[other], k)
					}
				}
			}
		default:
			m.Sweep()
			for _, other := range models {
				for k, e := range ref[other] {
					if expired(e) {
						want = append(want, other+"/"+SessionTTL.String())
						delete(ref[other], k)
					}
				}
			}
		}
		slices.Sort(events)
		slices.Sort(want)
		if !slices.Equal(events, want) {
			t.Fatalf("step %d: OnEvict reported %v, want %v", step, events, want)
		}
		for _, other := range models {
			if got := m.Len(other); got != len(ref[other]) {
				t.Fatalf("step %d: Len(%s) = %d, want %d", step, other, got, len(ref[other]))
			}
			if ms := m.lookup(other); ms != nil {
				checkList(t, ms)
			}
		}
		if m.Total() != refTotal() {
			t.Fatalf("step %d: Total = %d, want %d", step, m.Total(), refTotal())
		}
	}
	if fromOtherModel < 100 || fromOwnModel < 100 {
		t.Fatalf("%d new keys evicted from another model, %d from their own; the workload no longer covers both paths",
			fromOtherModel, fromOwnModel)
	}
	t.Logf("%d new keys evicted from another model, %d from their own", fromOtherModel, fromOwnModel)
}
