package policy_test

import (
	"fmt"
	"testing"

	"github.com/cacheroute/cacheroute/internal/policy"
	"github.com/cacheroute/cacheroute/internal/protocol"
)

// BenchmarkSelect measures one selection by each baseline policy over 8 and 64 idle workers,
// with a different hash key per request.
func BenchmarkSelect(b *testing.B) {
	keys := make([]*protocol.Request, 1024)
	for i := range keys {
		keys[i] = &protocol.Request{HashKey: fmt.Sprintf("session-%d", i)}
	}
	for _, name := range []string{"random", "round_robin", "power_of_two", "consistent_hash", "rendezvous_hash"} {
		for _, n := range []int{8, 64} {
			b.Run(fmt.Sprintf("%s/workers=%d", name, n), func(b *testing.B) {
				p := newFleet(b, n, 1)
				pol, err := policy.New(name, policy.Env{}, nil)
				if err != nil {
					b.Fatal(err)
				}
				in := input(p, "")
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					in.Request = keys[i%len(keys)]
					i++
					if pol.Select(in).Worker == nil {
						b.Fatal("no worker")
					}
				}
			})
		}
	}
}

func BenchmarkLeastLoaded(b *testing.B) {
	for _, n := range []int{8, 64} {
		b.Run(fmt.Sprintf("workers=%d", n), func(b *testing.B) {
			all := newFleet(b, n, 1).All()
			b.ReportAllocs()
			for b.Loop() {
				if policy.LeastLoaded(all) == nil {
					b.Fatal("no worker")
				}
			}
		})
	}
}
