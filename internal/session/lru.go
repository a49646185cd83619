package session

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/cacheroute/cacheroute/internal/tenant"
)

// none marks the end of a list.
const none int32 = -1

// entry is one session. Entries live in one slice and link to each other by int32 index:
// a link costs 4 bytes instead of 8, and the collector has no link pointers to follow.
type entry struct {
	key      string
	lastUsed int64 // nanoseconds since Memory.epoch at the last Set or Get
	// prev and next link the least-recently-used list; next also links the free list.
	prev, next int32
	tenant     uint32
}

// modelSessions is one model's map: an index from key to slot, the slots, and an intrusive
// doubly linked list of slots from most (head) to least (tail) recently used.
type modelSessions struct {
	name string // the model, owned by the store
	mu   sync.Mutex
	// size mirrors len(index), written under mu; it can be read without mu (Len, Counts, and
	// whether other models hold entries at all), at the price of being a moment old.
	size atomic.Int32
	// oldest mirrors the access time of the tail, the model's least recently used entry
	// (math.MaxInt64 while the list is empty). It is written under mu whenever the tail or its
	// access time changes, which the common paths rarely do, and read without mu by Sets of
	// other models looking for the store's least recently used entry.
	oldest     atomic.Int64
	index      map[string]int32
	entries    []entry
	head, tail int32
	free       int32
	tenants    tenantTable
}

func newModelSessions(name string) *modelSessions {
	ms := &modelSessions{
		name:  name,
		index: make(map[string]int32),
		head:  none,
		tail:  none,
		free:  none,
	}
	ms.oldest.Store(math.MaxInt64)
	return ms
}

// setTailLocked makes i the tail and mirrors its access time into oldest.
func (ms *modelSessions) setTailLocked(i int32) {
	ms.tail = i
	if i == none {
		ms.oldest.Store(math.MaxInt64)
	} else {
		ms.oldest.Store(ms.entries[i].lastUsed)
	}
}

// addLocked stores a new entry at the front of the list. key must be owned by the store.
func (ms *modelSessions) addLocked(key string, tenant uint32, now int64) {
	i := ms.free
	if i != none {
		ms.free = ms.entries[i].next
	} else {
		i = int32(len(ms.entries))
		ms.entries = append(ms.entries, entry{})
	}
	ms.entries[i] = entry{key: key, lastUsed: now, prev: none, next: none, tenant: tenant}
	ms.index[key] = i
	ms.size.Add(1)
	ms.pushFrontLocked(i)
}

// removeLocked drops entry i and puts its slot on the free list.
func (ms *modelSessions) removeLocked(i int32) {
	e := &ms.entries[i]
	ms.unlinkLocked(i)
	delete(ms.index, e.key)
	ms.size.Add(-1)
	ms.tenants.release(e.tenant)
	*e = entry{next: ms.free, prev: none}
	ms.free = i
}

func (ms *modelSessions) unlinkLocked(i int32) {
	e := &ms.entries[i]
	if e.prev != none {
		ms.entries[e.prev].next = e.next
	} else {
		ms.head = e.next
	}
	if e.next != none {
		ms.entries[e.next].prev = e.prev
	} else {
		ms.setTailLocked(e.prev)
	}
	e.prev, e.next = none, none
}

func (ms *modelSessions) pushFrontLocked(i int32) {
	e := &ms.entries[i]
	e.prev, e.next = none, ms.head
	if ms.head != none {
		ms.entries[ms.head].prev = i
	}
	ms.head = i
	if ms.tail == none {
		ms.setTailLocked(i)
	}
}

// moveToFrontLocked makes entry i, whose access time the caller has just set, the most
// recently used.
func (ms *modelSessions) moveToFrontLocked(i int32) {
	if ms.head == i {
		if ms.tail == i { // the only entry: the tail's access time changed
			ms.oldest.Store(ms.entries[i].lastUsed)
		}
		return
	}
	ms.unlinkLocked(i)
	ms.pushFrontLocked(i)
}

// tenantTable interns worker IDs so entries hold a 4-byte id instead of a copy of the worker
// URL. Ids are reference counted and reused once no entry points at them.
type tenantTable struct {
	ids   map[tenant.ID]uint32
	names []tenant.ID
	refs  []int32
	free  []uint32
}

func (tt *tenantTable) acquire(worker tenant.ID) uint32 {
	if id, ok := tt.ids[worker]; ok {
		tt.refs[id]++
		return id
	}
	if tt.ids == nil {
		tt.ids = make(map[tenant.ID]uint32)
	}
	worker = tenant.ID(strings.Clone(string(worker)))
	var id uint32
	if n := len(tt.free); n > 0 {
		id = tt.free[n-1]
		tt.free = tt.free[:n-1]
		tt.names[id], tt.refs[id] = worker, 1
	} else {
		id = uint32(len(tt.names))
		tt.names = append(tt.names, worker)
		tt.refs = append(tt.refs, 1)
	}
	tt.ids[worker] = id
	return id
}

func (tt *tenantTable) release(id uint32) {
	tt.refs[id]--
	if tt.refs[id] == 0 {
		delete(tt.ids, tt.names[id])
		tt.names[id] = ""
		tt.free = append(tt.free, id)
	}
}

// withBase returns the ids of the tenants that tenant.HasBase(tenant, base).
func (tt *tenantTable) withBase(base string) []uint32 {
	var ids []uint32
	for name, id := range tt.ids {
		if tenant.HasBase(string(name), base) {
			ids = append(ids, id)
		}
	}
	return ids
}

func containsID(ids []uint32, id uint32) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}
