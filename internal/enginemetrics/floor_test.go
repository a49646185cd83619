package enginemetrics

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/upstream"
)

// BenchmarkRoundTripFloor is the least a scrape can cost here: one HTTP round trip over a kept
// connection to each of 64 workers in another process, one after the other, with nothing else
// (no goroutine per scrape, no parsing, no bookkeeping). It reports this process's CPU time per
// round trip, the floor under BenchmarkScrape64Workers' %core.
func BenchmarkRoundTripFloor(b *testing.B) {
	if testing.Short() {
		b.Skip("starts 64 servers in a second process")
	}
	urls := startFleet(b, 64)
	q := New(nil, Options{Interval: time.Second}, nil).query
	var conns []*conn
	for _, u := range urls {
		t, err := newTarget(upstream.Dialer{}, u, q)
		if err != nil {
			b.Fatal(err)
		}
		c, err := dial(context.Background(), upstream.Dialer{}, t)
		if err != nil {
			b.Fatal(err)
		}
		defer c.close()
		conns = append(conns, c)
	}
	var buf bytes.Buffer
	cpu0, n := cpuTime(), 0
	b.ResetTimer()
	for b.Loop() {
		for _, c := range conns {
			buf.Reset()
			if err := c.send(time.Now().Add(time.Second)); err != nil {
				b.Fatal(err)
			}
			if status, _, err := c.receive(&buf); err != nil || status != 200 {
				b.Fatal(status, err)
			}
			n++
		}
	}
	b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/1e3/float64(n), "cpu-µs/scrape")
}
