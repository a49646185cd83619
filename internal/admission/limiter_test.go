package admission_test

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/admission"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

func newLimiter(t *testing.T, rates map[string]admission.Rate) (*admission.MemoryLimiter, *testkit.Clock) {
	t.Helper()
	clk := testkit.NewClock()
	m, err := admission.NewMemoryLimiter(rates, clk.Now)
	if err != nil {
		t.Fatal(err)
	}
	return m, clk
}

func TestMemoryLimiter_BurstsAMinuteThenRefillsAtTheRate(t *testing.T) {
	m, clk := newLimiter(t, map[string]admission.Rate{"a": {RequestsPerMinute: 60}})
	for i := range 60 {
		if d := m.Check(t.Context(), "a", 0); !d.Allowed {
			t.Fatalf("request %d of a full bucket of 60 refused: %+v", i, d)
		}
	}
	d := m.Check(t.Context(), "a", 0)
	if d.Allowed || d.RetryAfter != time.Second {
		t.Fatalf("61st request: %+v, want refused with Retry-After 1s", d)
	}
	clk.Advance(400 * time.Millisecond)
	if d := m.Check(t.Context(), "a", 0); d.Allowed || d.RetryAfter != 600*time.Millisecond {
		t.Fatalf("after 0.4s: %+v, want refused with Retry-After 0.6s", d)
	}
	clk.Advance(600 * time.Millisecond)
	if d := m.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 0 {
		t.Fatalf("after 1s: %+v, want one request allowed and none remaining", d)
	}
	clk.Advance(time.Hour) // refills to the limit, not past it
	if d := m.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 59 || d.Requests.Reset != time.Second {
		t.Fatalf("after an hour: %+v, want 59 remaining and full again in 1s", d.Requests)
	}
}

func TestMemoryLimiter_HeaderValues(t *testing.T) {
	m, clk := newLimiter(t, map[string]admission.Rate{"a": {RequestsPerMinute: 100, TokensPerMinute: 1000}})
	d := m.Check(t.Context(), "a", 300)
	want := admission.Decision{
		Allowed:  true,
		Requests: admission.Quota{Limit: 100, Remaining: 99, Reset: 600 * time.Millisecond},
		Tokens:   admission.Quota{Limit: 1000, Remaining: 700, Reset: 18 * time.Second},
	}
	if d != want {
		t.Fatalf("decision %+v, want %+v", d, want)
	}
	clk.Advance(6 * time.Second) // refills 100 tokens and every request
	d = m.Check(t.Context(), "a", 50)
	want.Requests.Reset = 600 * time.Millisecond
	want.Tokens = admission.Quota{Limit: 1000, Remaining: 750, Reset: 15 * time.Second}
	if d != want {
		t.Fatalf("6s later: %+v, want %+v", d, want)
	}
}

func TestMemoryLimiter_RefusesWithoutTakingFromEitherBucket(t *testing.T) {
	m, clk := newLimiter(t, map[string]admission.Rate{"a": {RequestsPerMinute: 10, TokensPerMinute: 600}})
	if d := m.Check(t.Context(), "a", 500); !d.Allowed {
		t.Fatalf("first request refused: %+v", d)
	}
	d := m.Check(t.Context(), "a", 200) // 100 tokens left: refused
	if d.Allowed || d.RetryAfter != 10*time.Second {
		t.Fatalf("over the tokens: %+v, want refused with Retry-After 10s (100 more tokens at 10/s)", d)
	}
	if d.Requests.Remaining != 9 || d.Tokens.Remaining != 100 {
		t.Fatalf("after a refusal: %d requests and %d tokens remaining, want 9 and 100", d.Requests.Remaining, d.Tokens.Remaining)
	}
	clk.Advance(10 * time.Second)
	if d := m.Check(t.Context(), "a", 200); !d.Allowed || d.Tokens.Remaining != 0 {
		t.Fatalf("10s later: %+v, want allowed with 0 tokens remaining", d)
	}
}

func TestMemoryLimiter_RetryAfterIsTheLongerOfTheTwoWaits(t *testing.T) {
	m, _ := newLimiter(t, map[string]admission.Rate{"a": {RequestsPerMinute: 1, TokensPerMinute: 60}})
	m.Check(t.Context(), "a", 60)
	if d := m.Check(t.Context(), "a", 1); d.Allowed || d.RetryAfter != time.Minute {
		t.Fatalf("%+v, want refused for a minute (the request bucket), not 1s (the token one)", d)
	}
}

func TestMemoryLimiter_TooLargeNeverFits(t *testing.T) {
	m, _ := newLimiter(t, map[string]admission.Rate{"a": {TokensPerMinute: 1000}})
	d := m.Check(t.Context(), "a", 1001)
	if d.Allowed || !d.TooLarge || d.RetryAfter != 0 {
		t.Fatalf("%+v, want refused as too large, without Retry-After", d)
	}
	if d := m.Check(t.Context(), "a", 1000); !d.Allowed {
		t.Fatalf("a request of exactly the limit, into a full bucket, refused: %+v", d)
	}
}

func TestMemoryLimiter_UnlimitedDimensionHasNoHeaders(t *testing.T) {
	m, _ := newLimiter(t, map[string]admission.Rate{"a": {TokensPerMinute: 100}})
	d := m.Check(t.Context(), "a", 10)
	if !d.Allowed || d.Requests != (admission.Quota{}) || d.Tokens.Limit != 100 {
		t.Fatalf("%+v, want requests unlimited (zero quota) and tokens limited", d)
	}
}

func TestMemoryLimiter_UnconfiguredTenantsAreNotLimitedAndHoldNoState(t *testing.T) {
	m, _ := newLimiter(t, map[string]admission.Rate{"a": {RequestsPerMinute: 1}, "free": {}})
	for i := range 1000 {
		if d := m.Check(t.Context(), fmt.Sprint("client-", i), 1<<20); !d.Allowed || d != (admission.Decision{Allowed: true}) {
			t.Fatalf("unconfigured tenant: %+v, want allowed with no headers", d)
		}
	}
	if d := m.Check(t.Context(), "free", 1<<20); !d.Allowed {
		t.Fatalf("tenant configured with zero rates: %+v, want not limited", d)
	}
	if n := m.Buckets(); n != 1 {
		t.Fatalf("limiter holds %d tenants, want 1 (only the limited configured one)", n)
	}
}

func TestMemoryLimiter_RemainingIsExactWhenTheRateDoesNotDivideAMinute(t *testing.T) {
	m, clk := newLimiter(t, map[string]admission.Rate{"a": {RequestsPerMinute: 7}})
	for want := 6; want >= 0; want-- {
		if d := m.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != want {
			t.Fatalf("%+v, want allowed with %d remaining", d.Requests, want)
		}
	}
	// One request comes back every 60s/7; after seven of those periods all seven have.
	for range 7 {
		clk.Advance(time.Minute/7 + 1)
		if d := m.Check(t.Context(), "a", 0); !d.Allowed || d.Requests.Remaining != 0 {
			t.Fatalf("after a period: %+v, want exactly one request back", d)
		}
	}
}

func TestMemoryLimiter_ConcurrentChecksNeverExceedTheLimit(t *testing.T) {
	m, _ := newLimiter(t, map[string]admission.Rate{"a": {RequestsPerMinute: 50, TokensPerMinute: 5000}})
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				if m.Check(t.Context(), "a", 10).Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	if allowed.Load() != 50 {
		t.Fatalf("%d requests allowed with the clock stopped, want exactly 50", allowed.Load())
	}
}

func TestNewMemoryLimiter_RefusesNegativeRates(t *testing.T) {
	if _, err := admission.NewMemoryLimiter(map[string]admission.Rate{"a": {TokensPerMinute: -1}}, nil); err == nil {
		t.Fatal("a negative rate was accepted")
	}
}
