// Package fleet is the one way a worker enters and leaves the router's pool. Every path in (the
// static list, the admin API, each discovery source) calls Join with the worker's identity and
// role, and Join does the same steps for all of them: check the address against
// --worker-url-allow, register the worker's tenants with their role, tell the listeners (the
// policy, the metrics), and start the first probe. Leave and Remove are the reverse.
//
// A worker is held by the sources that joined it: one joined by two sources (a static worker that
// a pod watch also finds, a pod matched by a watch and a DNS name) stays until every one of them
// has left. The static list never leaves, so discovery never removes a static worker.
//
// A worker's record carries the KV-cache event endpoints its holders name for it (the admin API's,
// a pod annotation's), which the event subscriptions read (KVEvents).
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// Source names who asked for a worker: Static, Admin, or a discovery source by its name
// ("kubernetes", "dns", with the role for the per-role ones: "kubernetes-prefill").
type Source string

// The sources that are not discovery.
const (
	Static Source = "static" // --worker-urls, --prefill, --decode
	Admin  Source = "admin"  // POST /workers, /add_worker
)

// Listener hears of every worker that joins and leaves, with its tenants (one per data-parallel
// rank). Its calls are made one at a time, under the fleet's lock, and must not block.
type Listener interface {
	WorkerJoined(u tenant.URL, tenants []*workers.Worker)
	WorkerLeft(u tenant.URL, tenants []*workers.Worker)
}

// Errors of Join, Leave and Remove. ErrNotAllowed is tenant's, for the address outside
// --worker-url-allow.
var (
	// ErrExists: the source has already joined the worker.
	ErrExists = workers.ErrExists
	// ErrNotFound: no source (or not this one) holds the worker.
	ErrNotFound = workers.ErrNotFound
	// ErrRoleConflict: the worker is in the fleet with another role.
	ErrRoleConflict = errors.New("worker registered with another role")
	// ErrKVEvents: the KV-cache event endpoints named for the worker cannot be used.
	ErrKVEvents = errors.New("invalid kv events endpoint")
)

// Options configure a Fleet.
type Options struct {
	Pool    *workers.Pool
	Allowed tenant.Allowed // --worker-url-allow
	// Probe checks one registered worker URL now (health and models); it decides when a worker
	// that joined takes requests.
	Probe func(ctx context.Context, url string)
	// KVEvents are the event endpoints the command line names for single workers
	// (--kv-events-worker-endpoints): a worker of that URL has them whichever source joins it,
	// unless a holder names its own.
	KVEvents  map[tenant.URL]kvevents.WorkerEndpoints
	Listeners []Listener
	Log       *slog.Logger
	// Lookup resolves a localhost name when a worker joins (tenant.LookupLoopback); nil is the
	// system's resolver.
	Lookup func(ctx context.Context, host string) ([]netip.Addr, error)
}

// Fleet keeps the pool's membership: who joined each worker, and in which role.
type Fleet struct {
	opts Options

	mu      sync.Mutex
	members map[tenant.URL]*member
}

type member struct {
	role     workers.Role
	sources  map[Source]bool
	events   map[Source]kvevents.WorkerEndpoints // the endpoints each holder names, when it names any
	loopback tenant.Loopback                     // where it points on this machine, as it joined
}

// New returns an empty fleet over opts.Pool, which only the fleet must change.
func New(opts Options) *Fleet {
	if opts.Log == nil {
		opts.Log = slog.New(slog.DiscardHandler)
	}
	return &Fleet{opts: opts, members: map[tenant.URL]*member{}}
}

// Joined is the outcome of a Join.
type Joined struct {
	// New is true when this Join registered the worker, false when another source holds it
	// already (the source is then added to its holders, and nothing else changes).
	New bool
	// Probed is closed once the first probe of a new worker has finished (at once for one that
	// was there); until that probe passes the worker takes no request.
	Probed <-chan struct{}
}

// Join registers u for src with role: allow-checked, its tenants added to the pool with the role
// (unhealthy, so they take nothing yet), the listeners told, and its first probe started with ctx.
// A worker another source holds in the same role gains src as a holder; in another role the join
// is refused with ErrRoleConflict, and a second join by the same source with ErrExists. ev are the
// KV-cache event endpoints src names for u (zero: none); endpoints that fail their check refuse
// the join with ErrKVEvents.
//
// A worker is one worker under every spelling: tenant.NormalizeURL makes one of the spellings
// of a URL, and a URL whose host is this machine (a loopback address, 0.0.0.0, or a localhost name
// resolved now) that reaches a loopback address and port of a worker in the fleet under another
// spelling ("http://localhost:8000" beside "http://127.0.0.1:8000") is refused with ErrExists,
// naming that worker, whichever source gives it.
func (f *Fleet) Join(ctx context.Context, src Source, u tenant.URL, role workers.Role, ev kvevents.WorkerEndpoints) (Joined, error) {
	if u.IsZero() {
		return Joined{}, errors.New("no worker URL")
	}
	if err := ev.Check(); err != nil {
		return Joined{}, fmt.Errorf("%w: %w", ErrKVEvents, err)
	}
	loopback := tenant.LookupLoopback(ctx, u, f.opts.Lookup)
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.members[u]; m != nil {
		switch {
		case m.role != role:
			return Joined{}, fmt.Errorf("worker %s is a %s worker (from %s), not %s: %w", u.Redacted(), m.role, m.holders(), role, ErrRoleConflict)
		case m.sources[src]:
			return Joined{}, fmt.Errorf("worker %s: %w", u.Redacted(), ErrExists)
		}
		m.sources[src] = true
		m.name(src, ev)
		return Joined{Probed: closed}, nil
	}
	if other, addr, ok := f.sameLoopback(loopback); ok {
		return Joined{}, fmt.Errorf("worker %s is %s, already in the fleet (both reach %s): %w", u.Redacted(), other.Redacted(), addr, ErrExists)
	}
	if err := f.opts.Allowed.CheckURL(u.String()); err != nil {
		return Joined{}, err
	}
	tenants, err := f.opts.Pool.AddAs(u.String(), role)
	if err != nil {
		return Joined{}, err
	}
	m := &member{role: role, sources: map[Source]bool{src: true}, loopback: loopback}
	m.name(src, ev)
	f.members[u] = m
	for _, l := range f.opts.Listeners {
		l.WorkerJoined(u, tenants)
	}
	probed := make(chan struct{})
	go func() {
		defer close(probed)
		f.opts.Probe(ctx, u.String())
		f.opts.Log.Info("worker joined", "worker", u.Redacted(), "source", src, "role", role, "healthy", tenants[0].Healthy())
	}()
	return Joined{New: true, Probed: probed}, nil
}

// sameLoopback finds the member that l reaches under another spelling, and the loopback address
// they share; f.mu is held.
func (f *Fleet) sameLoopback(l tenant.Loopback) (tenant.URL, netip.Addr, bool) {
	if l.IsZero() {
		return tenant.URL{}, netip.Addr{}, false
	}
	for _, u := range slices.SortedFunc(maps.Keys(f.members), func(a, b tenant.URL) int { return strings.Compare(a.String(), b.String()) }) {
		if addr, ok := l.Shares(f.members[u].loopback); ok {
			return u, addr, true
		}
	}
	return tenant.URL{}, netip.Addr{}, false
}

// closed is the Probed of a worker that was there already.
var closed = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Leave drops src from u's holders and removes u when none is left (see Remove); it reports
// whether u was removed. ErrNotFound: src does not hold u.
func (f *Fleet) Leave(src Source, u tenant.URL) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.members[u]
	if m == nil || !m.sources[src] {
		return false, fmt.Errorf("worker %s (%s): %w", u.Redacted(), src, ErrNotFound)
	}
	delete(m.sources, src)
	delete(m.events, src)
	if len(m.sources) > 0 {
		return false, nil
	}
	return true, f.remove(u)
}

// Remove takes u out whichever sources hold it (the admin API's removal): its tenants leave the
// pool and the listeners forget everything that names them. Requests in flight on it finish. A
// discovery source that still reports it joins it again at its next report.
func (f *Fleet) Remove(u tenant.URL) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.members[u] == nil {
		return fmt.Errorf("worker %s: %w", u.Redacted(), ErrNotFound)
	}
	return f.remove(u)
}

func (f *Fleet) remove(u tenant.URL) error {
	delete(f.members, u)
	tenants, err := f.opts.Pool.Remove(u.String())
	if err != nil {
		return err
	}
	for _, l := range f.opts.Listeners {
		l.WorkerLeft(u, tenants)
	}
	f.opts.Log.Info("worker removed", "worker", u.Redacted())
	return nil
}

// Holders lists the sources that hold u, sorted; none when u is not in the fleet.
func (f *Fleet) Holders(u tenant.URL) []Source {
	f.mu.Lock()
	defer f.mu.Unlock()
	if m := f.members[u]; m != nil {
		return slices.Sorted(maps.Keys(m.sources))
	}
	return nil
}

// SetKVEvents replaces the KV-cache event endpoints src names for u (zero: none), as a pod whose
// annotation changed does; the subscriptions follow within a second. ErrNotFound: src does not
// hold u; ErrKVEvents: ev fail their check, and the endpoints stay as they were.
func (f *Fleet) SetKVEvents(src Source, u tenant.URL, ev kvevents.WorkerEndpoints) error {
	if err := ev.Check(); err != nil {
		return fmt.Errorf("%w: %w", ErrKVEvents, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.members[u]
	if m == nil || !m.sources[src] {
		return fmt.Errorf("worker %s (%s): %w", u.Redacted(), src, ErrNotFound)
	}
	m.name(src, ev)
	return nil
}

// KVEvents are the event endpoints of worker u: those the admin API named, else those of the
// first other holder by name that names any (a discovery source), else the command line's; zero
// when none does (the --kv-events-endpoint template then applies) or u is not in the fleet.
func (f *Fleet) KVEvents(u tenant.URL) kvevents.WorkerEndpoints {
	f.mu.Lock()
	defer f.mu.Unlock()
	m := f.members[u]
	if m == nil {
		return kvevents.WorkerEndpoints{}
	}
	if ev, ok := m.events[Admin]; ok {
		return ev
	}
	for _, src := range slices.Sorted(maps.Keys(m.events)) {
		return m.events[src]
	}
	return f.opts.KVEvents[u]
}

// name records the endpoints src names for the worker; f.mu is held.
func (m *member) name(src Source, ev kvevents.WorkerEndpoints) {
	if ev.IsZero() {
		delete(m.events, src)
		return
	}
	if m.events == nil {
		m.events = map[Source]kvevents.WorkerEndpoints{}
	}
	m.events[src] = ev
}

func (m *member) holders() string {
	return fmt.Sprint(slices.Sorted(maps.Keys(m.sources)))
}
