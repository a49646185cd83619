package responsesearch

import (
	"sync"
	"time"
)

// misses.go remembers, for a short while, the stored-response ids that no worker had: a GET,
// DELETE, cancel or input_items on an id the router does not know asks every healthy worker in
// turn, and a client that repeats such a request (polling a response that never existed, a
// client bug, a scan) would otherwise cost the fleet one call per worker every time. Only a
// search that every worker answered with 404 is remembered; one where a worker failed is not. A
// response stored meanwhile through another replica that shares no store with this one is found
// again once the entry expires.

// MissTTL is how long a miss is remembered.
const MissTTL = 5 * time.Second

// maxResponseMisses bounds the ids remembered; past it the oldest go first.
const maxResponseMisses = 16384

// misses is the set of ids recently not found, with their expiry.
type misses struct {
	mu    sync.Mutex
	until map[string]time.Time
	order []string // insertion order, for the bound
}

func newMisses() *misses {
	return &misses{until: map[string]time.Time{}}
}

// has reports whether id was not found on any worker within MissTTL of now.
func (m *misses) has(id string, now time.Time) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	t, ok := m.until[id]
	if ok && now.After(t) {
		delete(m.until, id)
		return false
	}
	return ok
}

// add remembers that no worker has id; id must be the caller's own string.
func (m *misses) add(id string, now time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.until[id]; !ok {
		for len(m.order) >= maxResponseMisses {
			delete(m.until, m.order[0])
			m.order = m.order[1:]
		}
		m.order = append(m.order, id)
	}
	m.until[id] = now.Add(MissTTL)
}
