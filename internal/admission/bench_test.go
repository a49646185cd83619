package admission_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/cacheroute/cacheroute/internal/admission"
)

// BenchmarkAdmitRelease measures one Admit and its Release: alone (uncontended), from every
// core with room for all (parallel: the lock is shared, nothing waits), and from every core
// with room for one (queueing: each request waits for the previous one's release).
// admitRelease admits one request of tk to c and releases its permit at once, failing the
// benchmark on a refusal: the unit every case of BenchmarkAdmitRelease times.
func admitRelease(b *testing.B, c *admission.Controller, tk admission.Ticket) {
	p, err := c.Admit(context.Background(), tk)
	if err != nil {
		b.Fatal(err)
	}
	p.Release()
}

func BenchmarkAdmitRelease(b *testing.B) {
	tk := admission.Ticket{Tenant: "a", Priority: "default"}
	levels := []string{"interactive", "default", "batch"}

	b.Run("uncontended", func(b *testing.B) {
		c, _ := admission.New(admission.Options{MaxInFlight: 64, QueueSize: 64, Priorities: levels})
		b.ReportAllocs()
		for b.Loop() {
			admitRelease(b, c, tk)
		}
	})
	b.Run("parallel", func(b *testing.B) {
		c, _ := admission.New(admission.Options{MaxInFlight: 1 << 20, QueueSize: 64, Priorities: levels})
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				admitRelease(b, c, tk)
			}
		})
	})
	b.Run("queueing", func(b *testing.B) {
		c, _ := admission.New(admission.Options{MaxInFlight: 1, QueueSize: 1 << 16, Priorities: levels})
		var tenant atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			tk := admission.Ticket{Tenant: fmt.Sprint(tenant.Add(1)), Priority: "batch"}
			for pb.Next() {
				admitRelease(b, c, tk)
			}
		})
	})
}

// BenchmarkMemoryLimiterCheck measures one Check, on one tenant from one core and on a tenant
// per core from every core.
func BenchmarkMemoryLimiterCheck(b *testing.B) {
	ctx := context.Background()
	rates := map[string]admission.Rate{}
	for i := range 64 {
		rates[fmt.Sprint(i)] = admission.Rate{RequestsPerMinute: 1 << 30, TokensPerMinute: 1 << 40}
	}
	m, err := admission.NewMemoryLimiter(rates, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("uncontended", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !m.Check(ctx, "0", 1000).Allowed {
				b.Fatal("refused")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		var next atomic.Int64
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			tenant := fmt.Sprint(next.Add(1) % 64)
			for pb.Next() {
				if !m.Check(ctx, tenant, 1000).Allowed {
					b.Fatal("refused")
				}
			}
		})
	})
}
