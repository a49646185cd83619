package fleet

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/kvevents"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// recorder is a Listener that keeps what it was told.
type recorder struct {
	mu     sync.Mutex
	joined []string // "url role tenants"
	left   []string
}

func (r *recorder) WorkerJoined(u tenant.URL, ts []*workers.Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ts {
		r.joined = append(r.joined, u.String()+" "+w.Role().String()+" "+w.Name())
	}
}

func (r *recorder) WorkerLeft(u tenant.URL, ts []*workers.Worker) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, w := range ts {
		r.left = append(r.left, w.Name())
	}
}

func (r *recorder) seen() (joined, left []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.joined), slices.Clone(r.left)
}

// newFleet is a fleet over a real pool (2 data-parallel ranks, so each worker has two tenants)
// with a real health checker, allowing 127.0.0.1 only.
func newFleet(t *testing.T) (*Fleet, *workers.Pool, *recorder) {
	t.Helper()
	pool := workers.NewPool(workers.Options{DPSize: 2, CBFailureThreshold: 5, CBTimeout: time.Second})
	checker := workers.NewChecker(pool, workers.HealthOptions{Endpoint: "/health", Interval: time.Hour, Timeout: 5 * time.Second,
		FailureThreshold: 1, SuccessThreshold: 1}, &http.Client{}, slog.New(slog.DiscardHandler))
	allowed, err := tenant.ParseAllowed([]string{"127.0.0.1/32"})
	if err != nil {
		t.Fatal(err)
	}
	rec := &recorder{}
	return New(Options{Pool: pool, Allowed: allowed, Probe: checker.Check, Listeners: []Listener{rec}}), pool, rec
}

// healthyWorker answers the probes on loopback.
func healthyWorker(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			_, _ = w.Write([]byte(`{"data":[{"id":"m"}]}`))
			return
		}
		w.WriteHeader(http.StatusOK)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

func mustURL(t *testing.T, raw string) tenant.URL {
	t.Helper()
	u, err := tenant.ParseURL(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// mustJoin joins the worker at u to f for src in role, without KV events, and returns once its
// first probe is done: the start of the tests about what a fleet does with a worker it holds.
func mustJoin(t *testing.T, f *Fleet, src Source, u tenant.URL, role workers.Role) Joined {
	t.Helper()
	j, err := f.Join(t.Context(), src, u, role, noEvents)
	if err != nil {
		t.Fatalf("Join(%s, %s, %v): %v", src, u, role, err)
	}
	waitProbed(t, j)
	return j
}

func waitProbed(t *testing.T, j Joined) {
	t.Helper()
	select {
	case <-j.Probed:
	case <-time.After(10 * time.Second):
		t.Fatal("the first probe did not finish")
	}
}

// Whatever the source, a worker joins the same way: its tenants registered with its role, the
// listeners told with that role already set, probed (so healthy once Probed is closed), and an
// address outside --worker-url-allow refused before anything is registered.
func TestEverySourceJoinsTheSameWay(t *testing.T) {
	for _, src := range []Source{Static, Admin, "kubernetes-decode", "dns"} {
		t.Run(string(src), func(t *testing.T) {
			f, pool, rec := newFleet(t)
			raw := healthyWorker(t)
			u := mustURL(t, raw+"/") // the trailing slash is gone from the identity
			j, err := f.Join(t.Context(), src, u, workers.RoleDecode, noEvents)
			if err != nil || !j.New {
				t.Fatalf("Join: %+v, %v", j, err)
			}
			waitProbed(t, j)
			ts := pool.Get(raw)
			if len(ts) != 2 || !ts[0].Healthy() || !ts[1].Healthy() || ts[0].Role() != workers.RoleDecode || ts[1].Role() != workers.RoleDecode {
				t.Fatalf("tenants after the join: %v", ts)
			}
			joined, _ := rec.seen()
			if want := []string{raw + " decode " + raw + "@0", raw + " decode " + raw + "@1"}; !slices.Equal(joined, want) {
				t.Fatalf("listener told %q, want %q", joined, want)
			}
			if got := f.Holders(u); !slices.Equal(got, []Source{src}) {
				t.Fatalf("holders %v, want [%s]", got, src)
			}

			outside := mustURL(t, "http://127.0.0.2:1")
			if _, err := f.Join(t.Context(), src, outside, workers.RoleDecode, noEvents); !errors.Is(err, tenant.ErrNotAllowed) {
				t.Fatalf("a worker outside the allow list: %v, want ErrNotAllowed", err)
			}
			if len(pool.Get(outside.String())) != 0 || f.Holders(outside) != nil {
				t.Fatal("a refused worker was registered")
			}
		})
	}
}

// One worker joins once under every spelling: the URL's canonical form makes one identity of
// "127.0.0.1:P", "http://127.0.0.1:P/x/.." and "HTTP://127.0.0.1:0P/", and "localhost:P", a name of
// the same loopback address, is refused as the worker already in the fleet, from any source.
func TestOneWorkerUnderSeveralSpellingsJoinsOnce(t *testing.T) {
	f, pool, _ := newFleet(t)
	f.opts.Lookup = func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("::1"), netip.MustParseAddr("127.0.0.1")}, nil
	}
	raw := healthyWorker(t)
	_, port, _ := strings.Cut(strings.TrimPrefix(raw, "http://"), ":")
	mustJoin(t, f, Admin, mustURL(t, raw), workers.RoleColocated)
	for _, c := range []struct {
		src      Source
		spelling string
	}{
		{Admin, raw + "/x/.."},
		{Admin, "HTTP://127.0.0.1:0" + port + "/"},
		{Admin, "http://localhost:" + port},
		{Admin, "http://LOCALHOST:" + port + "/./"},
		{"dns", "http://0.0.0.0:" + port},
		{Static, "http://localhost:" + port},
	} {
		_, err := f.Join(t.Context(), c.src, mustURL(t, c.spelling), workers.RoleColocated, noEvents)
		if !errors.Is(err, ErrExists) {
			t.Errorf("%s joined %s again: %v, want ErrExists", c.src, c.spelling, err)
		}
	}
	if n := len(pool.All()); n != 2 { // the worker's two ranks
		t.Fatalf("%d tenants in the pool, want the one worker's 2", n)
	}
	// Another port of the same address is another worker.
	other := mustURL(t, healthyWorker(t))
	if _, err := f.Join(t.Context(), Admin, other, workers.RoleColocated, noEvents); err != nil {
		t.Fatalf("another worker on the loopback: %v", err)
	}
}

// A worker joined by two sources stays while either holds it, and leaves, forgotten by the
// listeners, when the second one leaves.
func TestWorkerHeldByTwoSourcesStaysUntilBothLeave(t *testing.T) {
	f, pool, rec := newFleet(t)
	u := mustURL(t, healthyWorker(t))
	mustJoin(t, f, Static, u, workers.RolePrefill)
	again, err := f.Join(t.Context(), "kubernetes-prefill", u, workers.RolePrefill, noEvents)
	if err != nil || again.New {
		t.Fatalf("second source's join: %+v, %v; want held already", again, err)
	}
	waitProbed(t, again) // closed at once
	if removed, err := f.Leave("kubernetes-prefill", u); err != nil || removed {
		t.Fatalf("first leave: removed %v, %v", removed, err)
	}
	if len(pool.Get(u.String())) != 2 {
		t.Fatal("the worker left while the static list still held it")
	}
	if _, left := rec.seen(); len(left) != 0 {
		t.Fatalf("listeners told of a leave: %q", left)
	}
	if _, err := f.Leave("kubernetes-prefill", u); !errors.Is(err, ErrNotFound) {
		t.Fatalf("leaving twice: %v, want ErrNotFound", err)
	}
	if removed, err := f.Leave(Static, u); err != nil || !removed {
		t.Fatalf("last leave: removed %v, %v", removed, err)
	}
	if len(pool.Get(u.String())) != 0 || f.Holders(u) != nil {
		t.Fatal("the worker stayed after both sources left")
	}
	if _, left := rec.seen(); len(left) != 2 {
		t.Fatalf("listeners told of %q leaving, want both tenants", left)
	}
}

// A worker has one role: a join in another one is refused and changes nothing; a second join by
// the same source is ErrExists.
func TestJoinInAnotherRoleIsRefused(t *testing.T) {
	f, pool, _ := newFleet(t)
	u := mustURL(t, healthyWorker(t))
	mustJoin(t, f, Static, u, workers.RolePrefill)
	if _, err := f.Join(t.Context(), Admin, u, workers.RoleDecode, noEvents); !errors.Is(err, ErrRoleConflict) {
		t.Fatalf("join as decode: %v, want ErrRoleConflict", err)
	}
	if got := f.Holders(u); !slices.Equal(got, []Source{Static}) || pool.Get(u.String())[0].Role() != workers.RolePrefill {
		t.Fatalf("after the refused join: holders %v, role %v", got, pool.Get(u.String())[0].Role())
	}
	if _, err := f.Join(t.Context(), Static, u, workers.RolePrefill, noEvents); !errors.Is(err, ErrExists) {
		t.Fatalf("the same source again: %v, want ErrExists", err)
	}
}

// Remove (the admin API's) takes a worker out whichever sources hold it.
func TestRemoveTakesTheWorkerFromEverySource(t *testing.T) {
	f, pool, rec := newFleet(t)
	u := mustURL(t, healthyWorker(t))
	for _, src := range []Source{Static, "dns"} {
		mustJoin(t, f, src, u, workers.RoleColocated)
	}
	if err := f.Remove(u); err != nil {
		t.Fatal(err)
	}
	if len(pool.Get(u.String())) != 0 || f.Holders(u) != nil {
		t.Fatal("the worker is still there")
	}
	if _, left := rec.seen(); len(left) != 2 {
		t.Fatalf("listeners told of %q leaving, want both tenants", left)
	}
	if err := f.Remove(u); !errors.Is(err, ErrNotFound) {
		t.Fatalf("removing again: %v, want ErrNotFound", err)
	}
}

// noEvents is a join that names no KV-cache event endpoint.
var noEvents kvevents.WorkerEndpoints

// A worker's event endpoints are the admin API's while it names some, else a discovery source's,
// else the command line's, and go with the worker.
func TestWorkersEventEndpointsAreTheAdminAPIsThenDiscoverysThenTheCommandLines(t *testing.T) {
	f, _, _ := newFleet(t)
	u := mustURL(t, healthyWorker(t))
	flag := kvevents.WorkerEndpoints{Events: "tcp://127.0.0.1:6001"}
	f.opts.KVEvents = map[tenant.URL]kvevents.WorkerEndpoints{u: flag}
	pod := kvevents.WorkerEndpoints{Events: "tcp://{host}:6101", Replay: "tcp://{host}:6102"}
	admin := kvevents.WorkerEndpoints{Events: "tcp://127.0.0.1:6201"}
	step := func(what string, want kvevents.WorkerEndpoints) {
		t.Helper()
		if got := f.KVEvents(u); got != want {
			t.Fatalf("%s: %+v, want %+v", what, got, want)
		}
	}
	mustJoin(t, f, Static, u, workers.RoleColocated)
	step("joined by the static list", flag)
	if _, err := f.Join(t.Context(), "kubernetes", u, workers.RoleColocated, pod); err != nil {
		t.Fatal(err)
	}
	step("a pod annotation names its own", pod)
	if _, err := f.Join(t.Context(), Admin, u, workers.RoleColocated, admin); err != nil {
		t.Fatal(err)
	}
	step("the admin API names its own", admin)
	changed := kvevents.WorkerEndpoints{Events: "tcp://{host}:6301"}
	if err := f.SetKVEvents("kubernetes", u, changed); err != nil {
		t.Fatal(err)
	}
	step("the annotation changed under the admin API's", admin)
	if _, err := f.Leave(Admin, u); err != nil {
		t.Fatal(err)
	}
	step("the admin API left", changed)
	if err := f.SetKVEvents("kubernetes", u, noEvents); err != nil {
		t.Fatal(err)
	}
	step("the annotation went", flag)
	if err := f.Remove(u); err != nil {
		t.Fatal(err)
	}
	step("removed", noEvents)
	if err := f.SetKVEvents("kubernetes", u, pod); !errors.Is(err, ErrNotFound) {
		t.Fatalf("SetKVEvents on a removed worker: %v, want ErrNotFound", err)
	}
}

func TestJoinWithAnUnusableEventEndpointRegistersNothing(t *testing.T) {
	f, pool, rec := newFleet(t)
	u := mustURL(t, healthyWorker(t))
	if _, err := f.Join(t.Context(), Admin, u, workers.RoleColocated, kvevents.WorkerEndpoints{Events: "tcp://*:5557"}); !errors.Is(err, ErrKVEvents) {
		t.Fatalf("a wildcard endpoint: %v, want ErrKVEvents", err)
	}
	if joined, _ := rec.seen(); len(pool.All()) != 0 || len(joined) != 0 || len(f.Holders(u)) != 0 {
		t.Fatalf("refused, yet registered: pool %d, told %v, holders %v", len(pool.All()), joined, f.Holders(u))
	}
	good := kvevents.WorkerEndpoints{Events: "tcp://{host}:5557"}
	if _, err := f.Join(t.Context(), Admin, u, workers.RoleColocated, good); err != nil {
		t.Fatal(err)
	}
	if err := f.SetKVEvents(Admin, u, kvevents.WorkerEndpoints{Replay: "tcp://{host}:5558"}); !errors.Is(err, ErrKVEvents) {
		t.Fatalf("a replay endpoint alone: %v, want ErrKVEvents", err)
	}
	if got := f.KVEvents(u); got != good {
		t.Fatalf("a refused change changed the endpoints: %+v", got)
	}
}
