package admission

import (
	"context"
	"fmt"
	"math/bits"
	"sync"
	"time"
)

// Limiter decides whether a tenant's request fits its rate limits, and takes it from them when
// it does. The memory implementation is MemoryLimiter; one shared by several router replicas
// (on Redis, say) can satisfy the same interface.
type Limiter interface {
	// Check takes one request and tokens (the prompt estimate plus max_tokens) from tenant's
	// limits when both fit, and nothing when either does not.
	Check(ctx context.Context, tenant string, tokens int) Decision
}

// Rate is one tenant's limits; a zero field leaves that dimension unlimited.
type Rate struct {
	RequestsPerMinute int
	TokensPerMinute   int
}

// Decision is the answer of a Limiter.
type Decision struct {
	// Allowed: the request fits, and was taken from the limits.
	Allowed bool
	// TooLarge: the request's tokens exceed the tenant's whole TokensPerMinute, so it never
	// fits; retrying does not help.
	TooLarge bool
	// RetryAfter is how long until the request would fit, when it does not and is not
	// TooLarge.
	RetryAfter time.Duration
	// Requests and Tokens are the values of the x-ratelimit-*-requests and -tokens headers.
	Requests, Tokens Quota
}

// Quota is one dimension of a tenant's limits as the OpenAI rate-limit headers state it.
type Quota struct {
	Limit     int           // per minute; 0 means not limited, and no headers
	Remaining int           // whole units left, after this request when it was allowed
	Reset     time.Duration // until the limit is whole again
}

// MemoryLimiter keeps token buckets in process memory, one per limited dimension of each
// configured tenant. Each bucket holds up to a minute's limit and refills continuously at the
// limit per minute, so a tenant may burst its whole minute at once and then proceeds at the
// rate. Buckets exist only for the tenants given to NewMemoryLimiter, so the state is bounded
// by the configuration whatever names requests carry; a tenant not configured is not limited
// (map unknown clients to a configured tenant, "anonymous" say, to limit them). It is safe for
// concurrent use; tenants do not contend with each other.
type MemoryLimiter struct {
	now     func() time.Time
	tenants map[string]*tenantLimits // read-only after construction
}

// tenantLimits are one tenant's buckets, taken from together under mu.
type tenantLimits struct {
	mu               sync.Mutex
	requests, tokens bucket
}

// bucket is a token bucket of size limit that refills at limit per minute. It is kept as the
// instant it will be full again if nothing more is taken, which makes the arithmetic exact in
// nanoseconds: the bucket holds limit·(1 − debt/minute) where debt = full − now, and taking n
// pushes full n·minute/limit later.
type bucket struct {
	limit int64 // 0: not limited
	full  time.Time
}

// NewMemoryLimiter returns a limiter for the given tenants. now is the clock; nil means
// time.Now.
func NewMemoryLimiter(rates map[string]Rate, now func() time.Time) (*MemoryLimiter, error) {
	if now == nil {
		now = time.Now
	}
	m := &MemoryLimiter{now: now, tenants: make(map[string]*tenantLimits, len(rates))}
	for name, r := range rates {
		if r.RequestsPerMinute < 0 || r.TokensPerMinute < 0 {
			return nil, fmt.Errorf("admission: negative rate for tenant %q", name)
		}
		if r.RequestsPerMinute == 0 && r.TokensPerMinute == 0 {
			continue
		}
		m.tenants[name] = &tenantLimits{
			requests: bucket{limit: int64(r.RequestsPerMinute)},
			tokens:   bucket{limit: int64(r.TokensPerMinute)},
		}
	}
	return m, nil
}

// Check implements Limiter. ctx is not used: nothing here waits.
func (m *MemoryLimiter) Check(_ context.Context, tenant string, tokens int) Decision {
	t := m.tenants[tenant]
	if t == nil {
		return Decision{Allowed: true}
	}
	n := int64(max(tokens, 0))
	t.mu.Lock()
	defer t.mu.Unlock()
	now := m.now()
	if t.tokens.limit > 0 && n > t.tokens.limit {
		return Decision{TooLarge: true, Requests: t.requests.quota(now), Tokens: t.tokens.quota(now)}
	}
	waitReq := t.requests.wait(now, 1)
	waitTok := t.tokens.wait(now, n)
	if waitReq > 0 || waitTok > 0 {
		return Decision{RetryAfter: max(waitReq, waitTok), Requests: t.requests.quota(now), Tokens: t.tokens.quota(now)}
	}
	t.requests.take(now, 1)
	t.tokens.take(now, n)
	return Decision{Allowed: true, Requests: t.requests.quota(now), Tokens: t.tokens.quota(now)}
}

// cost is how far taking n pushes the bucket's full instant: n·minute/limit, rounded down so
// that the remaining count is never understated.
func (b *bucket) cost(n int64) time.Duration {
	return time.Duration(mulDiv(n, int64(time.Minute), b.limit))
}

// debt is how long until the bucket is full, at now.
func (b *bucket) debt(now time.Time) time.Duration {
	return max(b.full.Sub(now), 0)
}

// wait is how long until n fits in the bucket, at now; 0 when it fits already or the bucket
// does not limit. n must not exceed the limit.
func (b *bucket) wait(now time.Time, n int64) time.Duration {
	if b.limit == 0 {
		return 0
	}
	return max(b.debt(now)+b.cost(n)-time.Minute, 0)
}

// take removes n from the bucket, at now.
func (b *bucket) take(now time.Time, n int64) {
	if b.limit == 0 {
		return
	}
	b.full = now.Add(b.debt(now) + b.cost(n))
}

// quota states the bucket at now.
func (b *bucket) quota(now time.Time) Quota {
	if b.limit == 0 {
		return Quota{}
	}
	debt := b.debt(now)
	return Quota{
		Limit:     int(b.limit),
		Remaining: int(mulDiv(int64(time.Minute-debt), b.limit, int64(time.Minute))),
		Reset:     debt,
	}
}

// mulDiv returns a·b/c rounded down, for non-negative a and b and positive c, without
// overflowing in the product; the quotient must fit in an int64.
func mulDiv(a, b, c int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	q, _ := bits.Div64(hi, lo, uint64(c))
	return int64(q)
}
