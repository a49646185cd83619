package session_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/session"
	"github.com/cacheroute/cacheroute/internal/session/redistest"
	"github.com/cacheroute/cacheroute/internal/tenant"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// fakePrimary is a shared store in memory that can be made to fail.
type fakePrimary struct {
	*session.Memory
	mu    sync.Mutex
	err   error
	calls int
	ctxs  []context.Context
}

func newFakePrimary() *fakePrimary {
	return &fakePrimary{Memory: session.NewMemory(session.MemoryOptions{})}
}

func (p *fakePrimary) fail(err error) {
	p.mu.Lock()
	p.err = err
	p.mu.Unlock()
}

func (p *fakePrimary) enter(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls++
	p.ctxs = append(p.ctxs, ctx)
	return p.err
}

func (p *fakePrimary) callCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.calls
}

func (p *fakePrimary) Get(ctx context.Context, model, key string) (tenant.ID, bool, error) {
	if err := p.enter(ctx); err != nil {
		return "", false, err
	}
	return p.Memory.Get(ctx, model, key)
}

func (p *fakePrimary) Set(ctx context.Context, model, key string, worker tenant.ID) error {
	if err := p.enter(ctx); err != nil {
		return err
	}
	return p.Memory.Set(ctx, model, key, worker)
}

func (p *fakePrimary) Delete(ctx context.Context, model, key string) error {
	if err := p.enter(ctx); err != nil {
		return err
	}
	return p.Memory.Delete(ctx, model, key)
}

func (p *fakePrimary) Ping(ctx context.Context) error { return p.enter(ctx) }

// observed records Observe and OnError calls.
type observed struct {
	mu      sync.Mutex
	results map[string]int // "op/result"
	errors  map[string]int // op
}

func (o *observed) observe(op, result string, _ time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.results == nil {
		o.results = map[string]int{}
	}
	o.results[op+"/"+result]++
}

func (o *observed) onError(op string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.errors == nil {
		o.errors = map[string]int{}
	}
	o.errors[op]++
}

func (o *observed) result(op, result string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.results[op+"/"+result]
}

func (o *observed) errs(op string) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.errors[op]
}

func newFallback(p session.Primary, retry time.Duration) (*session.Fallback, *observed, *testkit.SyncBuffer) {
	obs := &observed{}
	logs := &testkit.SyncBuffer{}
	f := session.NewFallback(p, session.NewMemory(session.MemoryOptions{}), session.FallbackOptions{
		Backend:       "redis",
		RetryInterval: retry,
		Observe:       obs.observe,
		OnError:       obs.onError,
		Log:           slog.New(slog.NewTextHandler(logs, nil)),
	})
	return f, obs, logs
}

var errDown = errors.New("connection refused")

func TestFallback_UsesThePrimaryAndTeachesTheLocalStore(t *testing.T) {
	p := newFakePrimary()
	f, obs, _ := newFallback(p, time.Hour)
	mustSet(t, f, redisModel, "session:a", tenantA)
	mustGet(t, p, redisModel, "session:a", tenantA)         // written through
	mustGet(t, f.Local(), redisModel, "session:a", tenantA) // and kept locally

	// Another replica's write reaches this one through the primary, and a hit teaches the
	// local store too.
	mustSet(t, p.Memory, redisModel, "session:b", tenantB)
	mustGet(t, f, redisModel, "session:b", tenantB)
	mustGet(t, f.Local(), redisModel, "session:b", tenantB)
	// The primary wins over a stale local entry.
	mustSet(t, p.Memory, redisModel, "session:a", tenantB)
	mustGet(t, f, redisModel, "session:a", tenantB)

	if obs.result(session.OpSet, session.ResultOK) != 1 || obs.result(session.OpGet, session.ResultHit) != 2 {
		t.Fatalf("results %v", obs.results)
	}
	if s := f.Status(context.Background()); !s.Reachable || s.Backend != "redis" || s.LastError != "" {
		t.Fatalf("status %+v", s)
	}
}

func TestFallback_PrimaryFailureIsServedLocallyCountedAndSkipped(t *testing.T) {
	p := newFakePrimary()
	f, obs, logs := newFallback(p, time.Hour)
	mustSet(t, f, redisModel, "session:a", tenantA)

	p.fail(errDown)
	mustGet(t, f, redisModel, "session:a", tenantA) // from the local store
	if obs.errs(session.OpGet) != 1 || obs.result(session.OpGet, session.ResultError) != 1 {
		t.Fatalf("errors %v results %v", obs.errors, obs.results)
	}
	// Marked down: the next calls do not wait on the primary at all.
	calls := p.callCount()
	mustSet(t, f, redisModel, "session:b", tenantB)
	mustGet(t, f, redisModel, "session:b", tenantB)
	if err := f.Delete(context.Background(), redisModel, "session:b"); err != nil {
		t.Fatal(err)
	}
	mustGet(t, f, redisModel, "session:b", "")
	if p.callCount() != calls {
		t.Fatalf("the primary was called %d times while down", p.callCount()-calls)
	}
	if obs.result(session.OpGet, session.ResultSkipped) != 2 || obs.result(session.OpSet, session.ResultSkipped) != 1 || obs.result(session.OpDelete, session.ResultSkipped) != 1 {
		t.Fatalf("results %v", obs.results)
	}
	s := f.Status(context.Background())
	if s.Reachable || !strings.Contains(s.LastError, "connection refused") || s.LastErrorTime == nil {
		t.Fatalf("status %+v", s)
	}
	if n := strings.Count(logs.String(), "session store failed"); n != 1 {
		t.Fatalf("%d failure log lines, want 1:\n%s", n, logs)
	}
}

// A call that found every connection busy is served locally and counted, but the primary is not
// marked down: the next call tries it again.
func TestFallback_BusyPoolDoesNotMarkThePrimaryDown(t *testing.T) {
	p := newFakePrimary()
	f, obs, _ := newFallback(p, time.Hour)
	mustSet(t, f, redisModel, "session:a", tenantA)
	p.fail(fmt.Errorf("%w: connection pool timeout", session.ErrBusy))
	mustGet(t, f, redisModel, "session:a", tenantA)
	p.fail(nil)
	mustGet(t, f, redisModel, "session:a", tenantA)
	if obs.errs(session.OpGet) != 1 || obs.result(session.OpGet, session.ResultHit) != 1 || obs.result(session.OpGet, session.ResultSkipped) != 0 {
		t.Fatalf("errors %v results %v", obs.errors, obs.results)
	}
}

// After the retry interval one call tries the primary again; a success brings it back, and a
// session the local store learned while the primary was down is written back on its next read.
func TestFallback_RecoversAndWritesBackWhatItLearnedWhileDown(t *testing.T) {
	p := newFakePrimary()
	f, obs, logs := newFallback(p, time.Nanosecond) // every call is a retry
	p.fail(errDown)
	mustSet(t, f, redisModel, "session:outage", tenantA) // fails in the primary, kept locally
	if obs.errs(session.OpSet) != 1 {
		t.Fatalf("errors %v", obs.errors)
	}
	p.fail(nil)
	mustGet(t, f, redisModel, "session:outage", tenantA)        // primary miss, local hit
	mustGet(t, p.Memory, redisModel, "session:outage", tenantA) // written back for the other replicas
	if obs.result(session.OpGet, session.ResultMiss) != 1 || obs.result(session.OpSet, session.ResultOK) != 1 {
		t.Fatalf("results %v", obs.results)
	}
	if !f.Status(context.Background()).Reachable {
		t.Fatal("not reachable after a success")
	}
	if !strings.Contains(logs.String(), "reachable again") {
		t.Fatalf("no recovery log:\n%s", logs)
	}
}

// Failures are logged at most once per second however many there are.
func TestFallback_LogsAtMostOncePerSecond(t *testing.T) {
	p := newFakePrimary()
	p.fail(errDown)
	f, obs, logs := newFallback(p, time.Nanosecond)
	for range 500 {
		mustGet(t, f, redisModel, "session:a", "")
	}
	if obs.errs(session.OpGet) != 500 {
		t.Fatalf("%d errors counted, want 500", obs.errs(session.OpGet))
	}
	// 500 calls take far less than a few seconds; each second allows one line.
	if n := strings.Count(logs.String(), "session store failed"); n < 1 || n > 3 {
		t.Fatalf("%d failure log lines for 500 failures", n)
	}
}

// A caller that goes away does not cancel the store call, so it is not taken for a failure.
func TestFallback_CallerCancellationIsNotAStoreFailure(t *testing.T) {
	p := newFakePrimary()
	f, obs, _ := newFallback(p, time.Hour)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := f.Set(ctx, redisModel, "session:a", tenantA); err != nil {
		t.Fatal(err)
	}
	for _, c := range p.ctxs {
		if c.Err() != nil {
			t.Fatal("the primary got the caller's cancellation")
		}
	}
	if obs.errs(session.OpSet) != 0 {
		t.Fatal("counted as an error")
	}
}

// Removing a worker drops its entries locally; the primary's are left to the policy.
func TestFallback_RemoveTenantsWithBase(t *testing.T) {
	p := newFakePrimary()
	f, _, _ := newFallback(p, time.Hour)
	mustSet(t, f, redisModel, "session:a", tenantA)
	if err := f.RemoveTenantsWithBase(context.Background(), tenantA); err != nil {
		t.Fatal(err)
	}
	mustGet(t, f.Local(), redisModel, "session:a", "")
}

// Concurrent calls while the primary flaps: no race, no call lost.
func TestFallback_Concurrent(t *testing.T) {
	p := newFakePrimary()
	f, _, _ := newFallback(p, time.Microsecond)
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 200 {
				if g == 0 && i%20 == 0 {
					if i%40 == 0 {
						p.fail(errDown)
					} else {
						p.fail(nil)
					}
				}
				_ = f.Set(context.Background(), redisModel, "session:c", tenantA)
				if tenant, ok, err := f.Get(context.Background(), redisModel, "session:c"); err != nil || !ok || tenant != tenantA {
					t.Errorf("Get = %q %v %v", tenant, ok, err)
					return
				}
				_ = f.Status(context.Background())
			}
		})
	}
	wg.Wait()
}

// Against a real server: a stopped server sends every call to the local store within the
// timeout, and the store recovers once the server continues.
func TestFallback_RealRedisStalledThenResumed(t *testing.T) {
	srv := redistest.Start(t)
	r := newRedis(t, srv, session.RedisOptions{Timeout: 100 * time.Millisecond})
	f, obs, _ := newFallback(r, 50*time.Millisecond)
	mustSet(t, f, redisModel, "session:a", tenantA)
	srv.Pause()
	defer srv.Resume()
	for range 20 {
		mustGet(t, f, redisModel, "session:a", tenantA)
	}
	if !srv.Paused() {
		t.Fatal("the server is no longer stopped; the calls may have waited for it")
	}
	if obs.errs(session.OpGet) == 0 || obs.result(session.OpGet, session.ResultHit) != 0 {
		t.Fatalf("errors %v results %v", obs.errors, obs.results)
	}
	srv.Resume()
	waitOK(t, func() error {
		if !f.Status(context.Background()).Reachable {
			return errors.New("not reachable")
		}
		return nil
	})
	mustGet(t, f, redisModel, "session:a", tenantA)
	if obs.result(session.OpGet, session.ResultHit) != 1 {
		t.Fatalf("results %v", obs.results)
	}
}
