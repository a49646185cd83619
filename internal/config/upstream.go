package config

import "github.com/cacheroute/cacheroute/internal/upstream"

// UpstreamTimeouts is the one Timeouts value of every call to workers: the configured timeouts,
// and the defaults of those that are not configured.
func (c Config) UpstreamTimeouts() upstream.Timeouts {
	return upstream.Timeouts{
		Dial:           upstream.DefaultDial,
		KeepAlive:      upstream.DefaultKeepAlive,
		Idle:           upstream.DefaultIdle,
		Request:        c.RequestTimeout(),
		FirstByte:      c.FirstByteTimeout(),
		Stall:          c.StallTimeout(),
		Probe:          c.HealthCheckTimeout(),
		Scrape:         c.WorkerMetricsInterval * 9 / 10,
		Tokenize:       c.TokenizeTimeout(),
		TokenizePerKiB: c.TokenizeTimeoutPerKiB(),
		Lookup:         upstream.DefaultLookup,
	}
}
