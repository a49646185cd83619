// Package fleet is the one way a worker enters and leaves the router's pool. Every path in (the
// static list, the admin API, each discovery source) calls Join with the worker's identity and
// role, and Join does the same steps for all of them: check the address against
// --worker-url-allow, register the worker's tenants with their role, tell the listeners (the
// policy, the metrics), and start the first probe. Leave and Remove are the reverse.
//
// A worker is held by the sources that joined it: one joined by two sources (a static worker that
// a pod watch also finds, a pod matched by a watch and a DNS name) stays until every one of them
// has left. The static list never leaves, so discovery never removes a static worker.
package fleet

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"

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
)

// Options configure a Fleet.
type Options struct {
	Pool    *workers.Pool
	Allowed tenant.Allowed // --worker-url-allow
	// Probe checks one registered worker URL now (health and models); it decides when a worker
	// that joined takes requests.
	Probe     func(ctx context.Context, url string)
	Listeners []Listener
	Log       *slog.Logger
}

// Fleet keeps the pool's membership: who joined each worker, and in which role.
type Fleet struct {
	opts Options

	mu      sync.Mutex
	members map[tenant.URL]*member
}

type member struct {
	role    workers.Role
	sources map[Source]bool
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
// is refused with ErrRoleConflict, and a second join by the same source with ErrExists.
func (f *Fleet) Join(ctx context.Context, src Source, u tenant.URL, role workers.Role) (Joined, error) {
	if u.IsZero() {
		return Joined{}, errors.New("no worker URL")
	}
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
		return Joined{Probed: closed}, nil
	}
	if err := f.opts.Allowed.CheckURL(u.String()); err != nil {
		return Joined{}, err
	}
	tenants, err := f.opts.Pool.Add(u.String())
	if err != nil {
		return Joined{}, err
	}
	// The tenants are not healthy before their probe, so no request sees them before their role.
	for _, w := range tenants {
		w.SetRole(role)
	}
	f.members[u] = &member{role: role, sources: map[Source]bool{src: true}}
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

func (m *member) holders() string {
	return fmt.Sprint(slices.Sorted(maps.Keys(m.sources)))
}
