package responsesearch

import (
	"sync"
	"time"
)

// budget.go bounds the searches each client may start, and those all clients together may
// start: a search for an id the router does not know may cost a lookup on every worker, so a
// client that asks for ids at random (a scan, a client bug, a poll of an id that never existed
// and keeps changing) would otherwise multiply its traffic by the fleet's size, and many clients
// (or one with many addresses) would multiply it again by their number.

// maxSearchClients bounds the clients whose budgets are kept; past it, one is dropped at random
// to make room, and starts again with a full budget when it comes back.
const maxSearchClients = 16384

// budget is a token bucket per client, each holding a window's worth of searches and
// refilling continuously. A bucket is kept as the instant it would be full again had it no
// bound (a theoretical arrival time): a search is allowed when that instant is at most a
// window less one search ahead, and moves it one search later.
type budget struct {
	every time.Duration // the time one search takes to refill; 0: no bound
	burst time.Duration // how far ahead full may be: a window less one search
	mu    sync.Mutex
	full  map[string]time.Time
}

// newSearchBudget bounds each client to perMinute searches a minute, a minute's worth at once;
// 0 bounds none.
func newClientBudget(perMinute int) *budget {
	if perMinute <= 0 {
		return rateBudget(0, 0)
	}
	return rateBudget(time.Minute/time.Duration(perMinute), time.Minute)
}

// newTotalBudget bounds all clients together (one bucket, client "") to perSecond
// searches a second, a second's worth at once (at least one); 0 bounds none.
func newTotalBudget(perSecond float64) *budget {
	if perSecond <= 0 {
		return rateBudget(0, 0)
	}
	every := time.Duration(float64(time.Second) / perSecond)
	return rateBudget(every, max(time.Second, every))
}

// rateBudget allows one search every every, window's worth at once.
func rateBudget(every, window time.Duration) *budget {
	return &budget{every: every, burst: window - every, full: map[string]time.Time{}}
}

// allow takes one search from client's budget at now, or reports how long until one is there.
// client must be the caller's own string.
func (b *budget) allow(client string, now time.Time) (wait time.Duration, ok bool) {
	if b.every == 0 {
		return 0, true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	full, known := b.full[client]
	if !known {
		if len(b.full) >= maxSearchClients {
			for c := range b.full { // map order: an arbitrary client
				delete(b.full, c)
				break
			}
		}
	}
	if full.Before(now) {
		full = now
	}
	if ahead := full.Sub(now); ahead > b.burst {
		return ahead - b.burst, false
	}
	b.full[client] = full.Add(b.every)
	return 0, true
}
