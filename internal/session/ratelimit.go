package session

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/bits"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/cacheroute/cacheroute/internal/admission"
)

// OpRateLimit is the operation name a RedisLimiter reports to its Observe and OnError hooks,
// next to the session store's OpGet, OpSet, OpDelete and OpPing.
const OpRateLimit = "ratelimit"

// RedisLimiterOptions configure a RedisLimiter.
type RedisLimiterOptions struct {
	// Rates are the limited tenants, as for admission.NewMemoryLimiter: a tenant not named, or
	// named with two zero rates, is not limited.
	Rates map[string]admission.Rate
	// Fallback answers while Redis fails or is marked down. Default: a MemoryLimiter of Rates.
	Fallback admission.Limiter
	// RetryInterval is how long Redis is left alone after a failure before one check tries it
	// again. Default 1s (DefaultRetryInterval).
	RetryInterval time.Duration
	// Observe, if set, is told about every check of a limited tenant: OpRateLimit, the result
	// (ResultOK, ResultError or ResultSkipped) and how long Redis took (0 when skipped).
	Observe func(op, result string, d time.Duration)
	// OnError, if set, is told (with OpRateLimit) about every failed Redis call, before Observe.
	OnError func(op string)
	// Log receives the failures, at most one line per second, and the recoveries.
	Log *slog.Logger
}

// RedisLimiter is an admission.Limiter whose token buckets live in Redis, so that every router
// replica pointed at the same Redis takes from one budget per tenant. It answers exactly as
// admission.MemoryLimiter does (the same buckets, refusals, TooLarge, RetryAfter and header
// values), at microsecond rather than nanosecond resolution.
//
// A tenant's two buckets are one hash, <prefix>:rl:<tenant>, whose fields r (requests) and t
// (tokens) hold the instant each bucket is full again, in microseconds of the Redis server's
// clock: the replicas' own clocks never enter the arithmetic. One Lua script per check reads
// TIME and the hash, decides, and takes from both buckets or from neither, atomically; it runs
// by EVALSHA, and by EVAL the first time a server lacks it. An allowed check sets the hash to
// expire a minute after its later full instant, so an idle tenant's key leaves Redis once its
// buckets are full (at most two minutes after its last request).
//
// It fails open: when a call to Redis fails or takes longer than the store's timeout, the
// Fallback answers (by default a MemoryLimiter of the same rates, so each replica applies the
// whole limit on its own until Redis answers again), the failure is counted through OnError
// and logged at most once a second, and Redis is skipped for RetryInterval before one check
// tries it again (a call that only waited for a free pooled connection, ErrBusy, does not mark
// Redis down). The local buckets are not taught what Redis counted, nor Redis what the local
// buckets counted. Calls use the caller's values but not its cancellation.
//
// The arithmetic is exact for limits up to 150 million per minute (beyond, a minute's worth of
// microseconds times the limit leaves the 53 bits of a Lua number).
type RedisLimiter struct {
	client   redis.UniversalClient
	prefix   string
	timeout  time.Duration
	tenants  map[string]admission.Rate // read-only after construction
	fallback admission.Limiter
	opts     RedisLimiterOptions
	epoch    time.Time

	// clock, when set (tests only), is sent as the current instant in place of the server's
	// TIME.
	clock func() time.Time

	// downUntil is 0 while Redis is up; while it is down, the time (ns since epoch) after which
	// one check may try it again.
	downUntil atomic.Int64
	lastLog   atomic.Int64 // ns since epoch of the last failure log line
	muted     atomic.Int64 // failures not logged since then
}

var _ admission.Limiter = (*RedisLimiter)(nil)

// NewRedisLimiter returns a limiter that keeps its buckets in store's Redis, through store's
// client (one connection pool for sessions and rate limits), key prefix and timeout.
func NewRedisLimiter(store *Redis, opts RedisLimiterOptions) (*RedisLimiter, error) {
	if opts.RetryInterval <= 0 {
		opts.RetryInterval = DefaultRetryInterval
	}
	if opts.Log == nil {
		opts.Log = slog.Default()
	}
	tenants := make(map[string]admission.Rate, len(opts.Rates))
	for name, r := range opts.Rates {
		if r.RequestsPerMinute < 0 || r.TokensPerMinute < 0 {
			return nil, fmt.Errorf("session: negative rate for tenant %q", name)
		}
		if r.RequestsPerMinute > 0 || r.TokensPerMinute > 0 {
			tenants[name] = r
		}
	}
	if opts.Fallback == nil {
		m, err := admission.NewMemoryLimiter(tenants, nil)
		if err != nil {
			return nil, err
		}
		opts.Fallback = m
	}
	l := &RedisLimiter{
		client:   store.client,
		prefix:   store.prefix,
		timeout:  store.timeout,
		tenants:  tenants,
		fallback: opts.Fallback,
		opts:     opts,
		epoch:    time.Now(),
	}
	l.lastLog.Store(-int64(time.Second)) // the first failure is logged
	return l, nil
}

// Key returns the Redis key of a tenant's buckets: <prefix>:rl:<tenant>. The tenant is its last
// part, so no two tenants share a key, and no session key (<prefix>:sess2:…) is one.
func (l *RedisLimiter) Key(tenant string) string { return l.prefix + ":rl:" + tenant }

// Check implements admission.Limiter: one script run in Redis, or the fallback's answer.
func (l *RedisLimiter) Check(ctx context.Context, tenant string, tokens int) admission.Decision {
	rate, ok := l.tenants[tenant]
	if !ok {
		return admission.Decision{Allowed: true}
	}
	if !l.tryRedis() {
		l.observe(ResultSkipped, 0)
		return l.fallback.Check(ctx, tenant, tokens)
	}
	start := time.Now()
	d, err := l.check(detach(ctx), tenant, rate, int64(max(tokens, 0)))
	took := time.Since(start)
	if err != nil {
		l.failed(err, took)
		return l.fallback.Check(ctx, tenant, tokens)
	}
	if l.downUntil.Load() != 0 && l.downUntil.Swap(0) != 0 {
		l.opts.Log.Info("rate limits shared through Redis again")
	}
	l.observe(ResultOK, took)
	return d
}

// check runs the script for one request of n tokens.
func (l *RedisLimiter) check(ctx context.Context, tenant string, rate admission.Rate, n int64) (admission.Decision, error) {
	ctx, cancel := context.WithTimeout(ctx, l.timeout)
	defer cancel()
	args := []any{rate.RequestsPerMinute, rate.TokensPerMinute, n}
	if l.clock != nil {
		args = append(args, l.clock().UnixMicro())
	}
	res, err := rateScript.Run(ctx, l.client, []string{l.Key(tenant)}, args...).Int64Slice()
	if err != nil {
		return admission.Decision{}, wrapBusy(err)
	}
	if len(res) != 5 {
		return admission.Decision{}, fmt.Errorf("rate limit script answered %d values, want 5", len(res))
	}
	return admission.Decision{
		Allowed:    res[0] == 1,
		TooLarge:   res[1] == 1,
		RetryAfter: time.Duration(res[2]) * time.Microsecond,
		Requests:   quota(rate.RequestsPerMinute, res[3]),
		Tokens:     quota(rate.TokensPerMinute, res[4]),
	}, nil
}

// minuteMicros is the size of a bucket in time: a minute, in microseconds.
const minuteMicros = int64(time.Minute / time.Microsecond)

// quota states a bucket of limit per minute that is full again in debt µs, as
// admission.MemoryLimiter does: the whole units it holds, rounded down, and the time to full.
func quota(limit int, debt int64) admission.Quota {
	if limit == 0 {
		return admission.Quota{}
	}
	debt = min(max(debt, 0), minuteMicros)
	hi, lo := bits.Mul64(uint64(minuteMicros-debt), uint64(limit))
	remaining, _ := bits.Div64(hi, lo, uint64(minuteMicros))
	return admission.Quota{Limit: limit, Remaining: int(remaining), Reset: time.Duration(debt) * time.Microsecond}
}

// tryRedis reports whether this check may use Redis: always while it is up; while it is down,
// only the one check that claims the next retry slot.
func (l *RedisLimiter) tryRedis() bool {
	until := l.downUntil.Load()
	if until == 0 {
		return true
	}
	now := int64(time.Since(l.epoch))
	return now >= until && l.downUntil.CompareAndSwap(until, now+int64(l.opts.RetryInterval))
}

func (l *RedisLimiter) observe(result string, d time.Duration) {
	if l.opts.Observe != nil {
		l.opts.Observe(OpRateLimit, result, d)
	}
}

// failed counts and (at most once a second) logs a failed call, and marks Redis down unless the
// call only found every pooled connection busy.
func (l *RedisLimiter) failed(err error, d time.Duration) {
	now := int64(time.Since(l.epoch))
	if !errors.Is(err, ErrBusy) {
		l.downUntil.Store(max(now+int64(l.opts.RetryInterval), 1))
	}
	if l.opts.OnError != nil {
		l.opts.OnError(OpRateLimit)
	}
	l.observe(ResultError, d)
	last := l.lastLog.Load()
	if now-last < int64(time.Second) || !l.lastLog.CompareAndSwap(last, now) {
		l.muted.Add(1)
		return
	}
	l.opts.Log.Warn("rate limit check in Redis failed; this replica applies the limits on its own",
		"error", err, "retry_in", l.opts.RetryInterval, "failures_not_logged", l.muted.Swap(0))
}

// rateScript is one check, atomically, in the terms of admission.MemoryLimiter: a bucket is
// kept as the instant it is full again, its debt is how long until then (at most a minute), it
// holds limit·(1 − debt/minute), taking k pushes the instant k·minute/limit later (rounded
// down), and k fits when debt + that cost is at most a minute.
//
// KEYS[1] is the tenant's hash. ARGV: requests per minute and tokens per minute (0: that
// dimension is not limited), the request's tokens and, from tests only, the current instant in
// µs in place of the server's TIME. The answer is {allowed, too large, retry after µs,
// requests debt µs, tokens debt µs}, the debts after the request when it was allowed.
var rateScript = redis.NewScript(`
local minute = 60000000
local rlim, tlim, n = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local now
if ARGV[4] then
  now = tonumber(ARGV[4])
else
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end
local full = redis.call('HMGET', KEYS[1], 'r', 't')
local function debt(lim, f)
  if lim == 0 then return 0 end
  local d = (tonumber(f) or 0) - now
  if d < 0 then return 0 end
  if d > minute then return minute end
  return d
end
local function cost(k, lim)
  local p = k * minute
  local q = math.floor(p / lim)
  if q * lim > p then q = q - 1 elseif (q + 1) * lim <= p then q = q + 1 end
  return q
end
local rdebt, tdebt = debt(rlim, full[1]), debt(tlim, full[2])
if tlim > 0 and n > tlim then
  return {0, 1, 0, rdebt, tdebt}
end
local rnext, tnext, wait = rdebt, tdebt, 0
if rlim > 0 then
  rnext = rdebt + cost(1, rlim)
  wait = math.max(wait, rnext - minute)
end
if tlim > 0 then
  tnext = tdebt + cost(n, tlim)
  wait = math.max(wait, tnext - minute)
end
if wait > 0 then
  return {0, 0, wait, rdebt, tdebt}
end
redis.call('HSET', KEYS[1], 'r', now + rnext, 't', now + tnext)
redis.call('PEXPIRE', KEYS[1], math.ceil(math.max(rnext, tnext) / 1000) + 60000)
return {1, 0, 0, rnext, tnext}
`)
