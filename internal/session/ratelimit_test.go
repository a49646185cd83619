package session

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/session/redistest"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// These tests run RedisLimiters against a real redis-server on a loopback port. Two limiters on
// two stores (two clients, two connection pools) stand for two router replicas.

const rlPrefix = "rltest"

// rlStore is a Redis store on srv; the timeout is generous unless a test is about timeouts, so
// that a slow scheduler on a shared machine does not turn into a failure.
func rlStore(t testing.TB, srv *redistest.Server, timeout time.Duration) *Redis {
	t.Helper()
	s, err := NewRedis(RedisOptions{URL: srv.URL(), KeyPrefix: rlPrefix, Timeout: timeout})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// rlHooks records what a limiter reports.
type rlHooks struct {
	mu      sync.Mutex
	results map[string]int
	errors  int
	log     bytes.Buffer
}

func (h *rlHooks) observe(op, result string, _ time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.results == nil {
		h.results = map[string]int{}
	}
	h.results[op+"/"+result]++
}

func (h *rlHooks) onError(op string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if op != OpRateLimit {
		panic("OnError with op " + op)
	}
	h.errors++
}

func (h *rlHooks) Write(p []byte) (int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.log.Write(p)
}

func (h *rlHooks) count(result string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.results[OpRateLimit+"/"+result]
}

func (h *rlHooks) errorCount() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.errors
}

func (h *rlHooks) logged() string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.log.String()
}

// newRL returns a limiter on store for rates, reporting to hooks, whose clock is clk when clk
// is not nil (the server's TIME otherwise).
func newRL(t testing.TB, store *Redis, rates map[string]admission.Rate, clk *testkit.Clock, hooks *rlHooks, retry time.Duration) *RedisLimiter {
	t.Helper()
	if hooks == nil {
		hooks = &rlHooks{}
	}
	l, err := NewRedisLimiter(store, RedisLimiterOptions{
		Rates:         rates,
		RetryInterval: retry,
		Observe:       hooks.observe,
		OnError:       hooks.onError,
		Log:           slog.New(slog.NewTextHandler(hooks, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if clk != nil {
		l.clock = clk.Now
	}
	return l
}

func TestRedisLimiter_ReplicasShareATenantsBudget(t *testing.T) {
	srv := redistest.Start(t)
	rates := map[string]admission.Rate{"a": {RequestsPerMinute: 3}, "b": {RequestsPerMinute: 3}}
	one := newRL(t, rlStore(t, srv, 2*time.Second), rates, nil, nil, 0)
	two := newRL(t, rlStore(t, srv, 2*time.Second), rates, nil, nil, 0)
	for i, l := range []*RedisLimiter{one, two, one} {
		d := l.Check(t.Context(), "a", 0)
		if !d.Allowed || d.Requests.Limit != 3 || d.Requests.Remaining != 2-i {
			t.Fatalf("request %d of 3: %+v, want allowed with %d remaining", i+1, d, 2-i)
		}
	}
	d := two.Check(t.Context(), "a", 0)
	if d.Allowed || d.TooLarge || d.RetryAfter <= 0 || d.RetryAfter > 20*time.Second {
		t.Fatalf("4th request, on the other replica: %+v, want refused with a Retry-After of at most 20s", d)
	}
	if d.Requests.Limit != 3 || d.Requests.Remaining != 0 {
		t.Fatalf("4th request's quota %+v, want limit 3 and none remaining", d.Requests)
	}
	if d := two.Check(t.Context(), "b", 0); !d.Allowed || d.Requests.Remaining != 2 {
		t.Fatalf("tenant b after a's budget ran out: %+v, want its own full budget", d)
	}
}

// Checks from two replicas at once take exactly the budget: the script decides and takes in one
// step, so no two checks can both see the last request.
func TestRedisLimiter_ConcurrentChecksFromTwoReplicasNeverOverspend(t *testing.T) {
	srv := redistest.Start(t)
	clk := testkit.NewClock() // no refill during the test, however slow the machine
	rates := map[string]admission.Rate{"a": {RequestsPerMinute: 40, TokensPerMinute: 4000}}
	replicas := []*RedisLimiter{
		newRL(t, rlStore(t, srv, 2*time.Second), rates, clk, nil, 0),
		newRL(t, rlStore(t, srv, 2*time.Second), rates, clk, nil, 0),
	}
	var allowed, tokens atomic.Int64
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for i := range 25 {
				n := 50 + 25*((g+i)%3) // 50, 75 or 100 tokens
				if d := replicas[(g+i)%2].Check(t.Context(), "a", n); d.Allowed {
					allowed.Add(1)
					tokens.Add(int64(n))
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() > 40 || tokens.Load() > 4000 {
		t.Fatalf("allowed %d requests and %d tokens, want at most 40 and 4000", allowed.Load(), tokens.Load())
	}
	d := replicas[0].Check(t.Context(), "a", 0)
	if d.Requests.Remaining != 40-int(allowed.Load()) || d.Tokens.Remaining != 4000-int(tokens.Load()) {
		t.Fatalf("after the run: %+v, want %d requests and %d tokens remaining (what the allowed checks left)",
			d, 40-allowed.Load(), 4000-tokens.Load())
	}
}

func TestRedisLimiter_TokensPerMinuteAndTooLarge(t *testing.T) {
	srv := redistest.Start(t)
	clk := testkit.NewClock()
	l := newRL(t, rlStore(t, srv, 2*time.Second), map[string]admission.Rate{"a": {RequestsPerMinute: 10, TokensPerMinute: 1000}}, clk, nil, 0)
	want := admission.Decision{
		Allowed:  true,
		Requests: admission.Quota{Limit: 10, Remaining: 9, Reset: 6 * time.Second},
		Tokens:   admission.Quota{Limit: 1000, Remaining: 400, Reset: 36 * time.Second},
	}
	if d := l.Check(t.Context(), "a", 600); d != want {
		t.Fatalf("600 tokens: %+v, want %+v", d, want)
	}
	// 100 tokens short: refused until 100 more have come in, at 1000 a minute; nothing taken.
	want.Allowed, want.RetryAfter = false, 6*time.Second
	if d := l.Check(t.Context(), "a", 500); d != want {
		t.Fatalf("500 more tokens: %+v, want %+v", d, want)
	}
	// More than a whole minute's tokens never fit: no Retry-After, nothing taken.
	want.TooLarge, want.RetryAfter = true, 0
	if d := l.Check(t.Context(), "a", 1001); d != want {
		t.Fatalf("1001 tokens: %+v, want %+v", d, want)
	}
	d := l.Check(t.Context(), "a", 400)
	if !d.Allowed || d.Requests.Remaining != 8 || d.Tokens.Remaining != 0 {
		t.Fatalf("the 400 tokens left: %+v, want allowed, leaving 8 requests and no tokens", d)
	}
	// A tenant with only a token limit has no request headers, and a tenant new to Redis that
	// asks too much at once is refused without a key being made.
	tok := newRL(t, rlStore(t, srv, 2*time.Second), map[string]admission.Rate{"t": {TokensPerMinute: 100}}, clk, nil, 0)
	if d := tok.Check(t.Context(), "t", 101); d.Allowed || !d.TooLarge || d.Requests != (admission.Quota{}) || d.Tokens.Remaining != 100 {
		t.Fatalf("101 tokens of a 100/min tenant: %+v, want TooLarge, a full bucket and no request quota", d)
	}
	if n, err := srv.Client().Exists(t.Context(), tok.Key("t")).Result(); err != nil || n != 0 {
		t.Fatalf("a TooLarge request of a new tenant made its key (exists=%d, %v)", n, err)
	}
}

// For the same rates, clock and sequence of requests, the Redis limiter's decisions (and so the
// x-ratelimit-* and Retry-After headers made from them) are the MemoryLimiter's. The rates divide
// a minute into whole microseconds, the Redis limiter's resolution.
func TestRedisLimiter_DecisionsEqualMemoryLimiters(t *testing.T) {
	srv := redistest.Start(t)
	clk := testkit.NewClock()
	rates := map[string]admission.Rate{
		"both":     {RequestsPerMinute: 12, TokensPerMinute: 6000},
		"requests": {RequestsPerMinute: 3},
		"tokens":   {TokensPerMinute: 1000},
	}
	redisL := newRL(t, rlStore(t, srv, 2*time.Second), rates, clk, nil, 0)
	mem, err := admission.NewMemoryLimiter(rates, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	refused, tooLarge := 0, 0
	for i := range 600 {
		clk.Advance(time.Duration(rng.IntN(4000)) * time.Millisecond)
		tenant := []string{"both", "requests", "tokens"}[rng.IntN(3)]
		tokens := rng.IntN(1100)
		got, want := redisL.Check(t.Context(), tenant, tokens), mem.Check(t.Context(), tenant, tokens)
		if got != want {
			t.Fatalf("check %d (%s, %d tokens): Redis %+v, memory %+v", i, tenant, tokens, got, want)
		}
		if !got.Allowed && !got.TooLarge {
			refused++
		}
		if got.TooLarge {
			tooLarge++
		}
	}
	if refused < 50 || tooLarge == 0 {
		t.Fatalf("the sequence refused %d requests and found %d too large: it does not exercise the limits", refused, tooLarge)
	}
}

func TestRedisLimiter_BucketRefillsWithTime(t *testing.T) {
	srv := redistest.Start(t)
	clk := testkit.NewClock()
	l := newRL(t, rlStore(t, srv, 2*time.Second), map[string]admission.Rate{"a": {RequestsPerMinute: 3}}, clk, nil, 0)
	for range 3 {
		if d := l.Check(t.Context(), "a", 0); !d.Allowed {
			t.Fatalf("a full bucket of 3 refused: %+v", d)
		}
	}
	if d := l.Check(t.Context(), "a", 0); d.Allowed || d.RetryAfter != 20*time.Second {
		t.Fatalf("4th request: %+v, want refused with Retry-After 20s (one request per 20s)", d)
	}
	clk.Advance(20*time.Second - time.Millisecond)
	if d := l.Check(t.Context(), "a", 0); d.Allowed || d.RetryAfter != time.Millisecond {
		t.Fatalf("1ms before the refill: %+v, want refused with Retry-After 1ms", d)
	}
	clk.Advance(time.Millisecond)
	if d := l.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 0 {
		t.Fatalf("after 20s: %+v, want one request allowed and none remaining", d)
	}
	clk.Advance(time.Hour) // refills to the limit, not past it
	if d := l.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 2 || d.Requests.Reset != 20*time.Second {
		t.Fatalf("after an hour: %+v, want 2 remaining and full again in 20s", d.Requests)
	}
}

// Without a test clock the script reads the server's TIME: the refill happens as the server's
// clock moves. The wait is bounded; how fast it comes is not asserted.
func TestRedisLimiter_RefillsOnTheServersClock(t *testing.T) {
	srv := redistest.Start(t)
	l := newRL(t, rlStore(t, srv, 2*time.Second), map[string]admission.Rate{"a": {TokensPerMinute: 600}}, nil, nil, 0)
	if d := l.Check(t.Context(), "a", 600); !d.Allowed || d.Tokens.Remaining != 0 {
		t.Fatalf("a whole minute's tokens: %+v, want allowed with none remaining", d)
	}
	d := l.Check(t.Context(), "a", 1)
	if d.Allowed || d.RetryAfter <= 0 || d.RetryAfter > 100*time.Millisecond {
		t.Fatalf("one more token: %+v, want refused with a Retry-After of at most 100ms (600 tokens a minute)", d)
	}
	testkit.WaitFor(t, "the bucket to refill one token at 600 tokens a minute", func() bool { return l.Check(t.Context(), "a", 1).Allowed })
}

func TestRedisLimiter_KeyExpiresAMinuteAfterTheBucketsAreFull(t *testing.T) {
	srv := redistest.Start(t)
	clk := testkit.NewClock()
	l := newRL(t, rlStore(t, srv, 2*time.Second), map[string]admission.Rate{"a": {RequestsPerMinute: 3, TokensPerMinute: 600}}, clk, nil, 0)
	if l.Key("a") != rlPrefix+":rl:a" {
		t.Fatalf("key %q, want %s:rl:a", l.Key("a"), rlPrefix)
	}
	if d := l.Check(t.Context(), "a", 300); !d.Allowed { // requests full in 20s, tokens in 30s
		t.Fatalf("first request refused: %+v", d)
	}
	c := srv.Client()
	ttl, err := c.PTTL(t.Context(), l.Key("a")).Result()
	if err != nil {
		t.Fatal(err)
	}
	if ttl <= 80*time.Second || ttl > 90*time.Second {
		t.Fatalf("TTL %v, want a minute past the later bucket's full instant (30s): at most 90s, above 80s", ttl)
	}
	fields, err := c.HGetAll(t.Context(), l.Key("a")).Result()
	if err != nil || len(fields) != 2 || fields["r"] == "" || fields["t"] == "" {
		t.Fatalf("hash %v (%v), want the fields r and t", fields, err)
	}
	// A refused check writes nothing, so it does not keep an idle tenant's key alive.
	clk.Advance(10 * time.Second)
	if d := l.Check(t.Context(), "a", 500); d.Allowed {
		t.Fatalf("500 of the 400 tokens left refused? %+v", d)
	}
	if ttl2, _ := c.PTTL(t.Context(), l.Key("a")).Result(); ttl2 > ttl {
		t.Fatalf("a refused check raised the TTL from %v to %v", ttl, ttl2)
	}
	// An expired key is a full bucket.
	if err := c.Del(t.Context(), l.Key("a")).Err(); err != nil {
		t.Fatal(err)
	}
	if d := l.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 2 || d.Tokens.Remaining != 600 {
		t.Fatalf("after the key went: %+v, want full buckets", d)
	}
}

func TestRedisLimiter_UnknownTenantsAreNotLimited(t *testing.T) {
	srv := redistest.Start(t)
	hooks := &rlHooks{}
	l := newRL(t, rlStore(t, srv, 2*time.Second), map[string]admission.Rate{"a": {RequestsPerMinute: 1}, "off": {}}, nil, hooks, 0)
	for _, tenant := range []string{"stranger", "off"} {
		for range 3 {
			if d := l.Check(t.Context(), tenant, 1_000_000); d != (admission.Decision{Allowed: true}) {
				t.Fatalf("tenant %q: %+v, want allowed with no quotas", tenant, d)
			}
		}
	}
	keys, err := srv.Client().Keys(t.Context(), rlPrefix+":*").Result()
	if err != nil || len(keys) != 0 || hooks.count(ResultOK) != 0 {
		t.Fatalf("unlimited tenants made keys %v (%v) or %d Redis calls", keys, err, hooks.count(ResultOK))
	}
}

// Redis down: every check still answers, from the replica's own buckets; the failure is counted
// and logged, and Redis is skipped until the retry interval has passed.
func TestRedisLimiter_RedisStoppedFallsBackAndCountsTheError(t *testing.T) {
	srv := redistest.Start(t)
	hooks := &rlHooks{}
	l := newRL(t, rlStore(t, srv, 2*time.Second), map[string]admission.Rate{"a": {RequestsPerMinute: 2}}, nil, hooks, time.Hour)
	if d := l.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 1 || hooks.count(ResultOK) != 1 {
		t.Fatalf("through Redis: %+v (%d ok), want allowed with 1 remaining", d, hooks.count(ResultOK))
	}
	srv.Stop()
	// The local buckets know nothing of Redis's count: the whole limit, on this replica alone.
	for i := range 2 {
		if d := l.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 1-i {
			t.Fatalf("fallback request %d: %+v, want allowed with %d remaining", i+1, d, 1-i)
		}
	}
	if d := l.Check(t.Context(), "a", 0); d.Allowed || d.RetryAfter <= 0 {
		t.Fatalf("3rd fallback request: %+v, want refused by the local limit with a Retry-After", d)
	}
	if hooks.errorCount() != 1 || hooks.count(ResultError) != 1 || hooks.count(ResultSkipped) != 2 {
		t.Fatalf("%d errors, results %v: want 1 error, then 2 checks that skipped Redis", hooks.errorCount(), hooks.results)
	}
	if log := hooks.logged(); strings.Count(log, "level=WARN") != 1 || !strings.Contains(log, "on its own") {
		t.Fatalf("log %q, want one warning", log)
	}
}

// A stalled Redis costs a check the store's timeout, then the fallback answers.
func TestRedisLimiter_StalledRedisFallsBackAtTheTimeout(t *testing.T) {
	srv := redistest.Start(t)
	hooks := &rlHooks{}
	l := newRL(t, rlStore(t, srv, 100*time.Millisecond), map[string]admission.Rate{"a": {RequestsPerMinute: 5}}, nil, hooks, time.Hour)
	if d := l.Check(t.Context(), "a", 0); !d.Allowed || hooks.count(ResultOK) != 1 {
		t.Fatalf("through Redis: %+v", d)
	}
	srv.Pause()
	t.Cleanup(srv.Resume)
	if d := l.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 4 {
		t.Fatalf("Redis stalled: %+v, want the fallback's answer (allowed, 4 of its 5 left)", d)
	}
	if hooks.errorCount() != 1 || !strings.Contains(hooks.logged(), "deadline") && !strings.Contains(hooks.logged(), "timeout") {
		t.Fatalf("%d errors, log %q: want one timeout counted and logged", hooks.errorCount(), hooks.logged())
	}
}

// After an outage the replicas share again, without a restart, once a retry finds Redis up.
func TestRedisLimiter_SharesAgainWhenRedisComesBack(t *testing.T) {
	srv := redistest.Start(t)
	hooks := &rlHooks{}
	rates := map[string]admission.Rate{"a": {RequestsPerMinute: 2}}
	one := newRL(t, rlStore(t, srv, 2*time.Second), rates, nil, hooks, 20*time.Millisecond)
	two := newRL(t, rlStore(t, srv, 2*time.Second), rates, nil, nil, 0)
	srv.Stop()
	if d := one.Check(t.Context(), "a", 0); !d.Allowed || hooks.errorCount() != 1 {
		t.Fatalf("Redis down: %+v with %d errors, want the fallback's answer and the error counted", d, hooks.errorCount())
	}
	srv.Restart()
	reached := testkit.Poll(15*time.Second, 20*time.Millisecond, func() bool {
		if hooks.count(ResultOK) > 0 {
			return true
		}
		one.Check(t.Context(), "a", 0)
		return false
	})
	if !reached {
		t.Fatalf("no check reached Redis within 15s of its restart; results %v", hooks.results)
	}
	// The check that reached Redis took one of its two; the other replica takes the last.
	if d := two.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 0 {
		t.Fatalf("the other replica after the recovery: %+v, want the last request of the shared budget", d)
	}
	if !strings.Contains(hooks.logged(), "again") {
		t.Fatalf("log %q, want the recovery noted", hooks.logged())
	}
}

// A client that went away does not make the check a Redis failure.
func TestRedisLimiter_CallerCancellationIsNotARedisFailure(t *testing.T) {
	srv := redistest.Start(t)
	hooks := &rlHooks{}
	l := newRL(t, rlStore(t, srv, 2*time.Second), map[string]admission.Rate{"a": {RequestsPerMinute: 5}}, nil, hooks, time.Hour)
	cctx, cancel := context.WithCancel(t.Context())
	cancel()
	if d := l.Check(cctx, "a", 0); !d.Allowed || hooks.count(ResultOK) != 1 || hooks.errorCount() != 0 {
		t.Fatalf("cancelled caller: %+v, results %v, %d errors: want the check made in Redis", d, hooks.results, hooks.errorCount())
	}
}

// The script is sent again (EVAL) when the server does not have it, after a restart or a
// SCRIPT FLUSH, and not counted as a failure.
func TestRedisLimiter_RunsAfterTheServerForgetsTheScript(t *testing.T) {
	srv := redistest.Start(t)
	hooks := &rlHooks{}
	l := newRL(t, rlStore(t, srv, 2*time.Second), map[string]admission.Rate{"a": {RequestsPerMinute: 5}}, nil, hooks, time.Hour)
	for i := range 3 {
		if err := srv.Client().ScriptFlush(t.Context()).Err(); err != nil {
			t.Fatal(err)
		}
		if d := l.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 4-i {
			t.Fatalf("check %d after SCRIPT FLUSH: %+v", i+1, d)
		}
	}
	if hooks.errorCount() != 0 || hooks.count(ResultOK) != 3 {
		t.Fatalf("results %v, %d errors: want 3 checks made in Redis", hooks.results, hooks.errorCount())
	}
}

func TestNewRedisLimiter_RefusesNegativeRates(t *testing.T) {
	store, err := NewRedis(RedisOptions{URL: "redis://127.0.0.1:1"})
	if err != nil {
		t.Fatal(err)
	}
	defer store.Close()
	if _, err := NewRedisLimiter(store, RedisLimiterOptions{Rates: map[string]admission.Rate{"a": {TokensPerMinute: -1}}}); err == nil {
		t.Fatal("a negative rate was accepted")
	}
}

// BenchmarkRedisLimiterCheck is one allowed check (one script run, a round trip to a local
// redis-server) from one goroutine; the parallel variant from GOMAXPROCS goroutines over 64
// tenants.
func BenchmarkRedisLimiterCheck(b *testing.B) {
	srv := redistest.Start(b)
	l := newRL(b, rlStore(b, srv, time.Second), map[string]admission.Rate{"a": {RequestsPerMinute: 100_000_000, TokensPerMinute: 100_000_000}}, nil, nil, 0)
	b.ReportAllocs()
	for b.Loop() {
		if d := l.Check(context.Background(), "a", 1000); !d.Allowed {
			b.Fatalf("refused: %+v", d)
		}
	}
}

func BenchmarkRedisLimiterCheckParallel(b *testing.B) {
	srv := redistest.Start(b)
	rates := make(map[string]admission.Rate, 64)
	tenants := make([]string, 64)
	for i := range tenants {
		tenants[i] = fmt.Sprintf("tenant-%d", i)
		rates[tenants[i]] = admission.Rate{RequestsPerMinute: 100_000_000, TokensPerMinute: 100_000_000}
	}
	hooks := &rlHooks{}
	l := newRL(b, rlStore(b, srv, time.Second), rates, nil, hooks, 0)
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1))
		for pb.Next() {
			l.Check(context.Background(), tenants[i%len(tenants)], 1000)
			i++
		}
	})
	if n := hooks.errorCount(); n > 0 {
		b.Fatalf("%d checks failed", n)
	}
}
