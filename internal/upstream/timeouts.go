package upstream

import "time"

// Timeouts bound every call the router makes to a worker. One value is built from the
// configuration (config.Config.UpstreamTimeouts) and handed to everything that talks to workers;
// docs/configuration.md lists them in one table. Zero means no bound of that kind.
type Timeouts struct {
	// Dial bounds connecting to a worker: TCP connect and, for https://, the TLS handshake.
	Dial time.Duration
	// KeepAlive is the period of TCP keep-alive probes on worker connections.
	KeepAlive time.Duration
	// Idle is how long an idle keep-alive connection to a worker may wait for reuse before it is
	// closed: shorter than the keep-alive of common servers, so the router closes it first.
	Idle time.Duration
	// Request bounds one routed request end to end, and one LoRA fan-out
	// (--request-timeout-secs).
	Request time.Duration
	// FirstByte bounds the wait for a worker's response headers, streamed answer or not, from the
	// request's first attempt: every attempt waits within the same deadline. A worker that missed
	// it without sending a byte of any answer for as long is out of rotation until it answers a
	// probe request (--first-byte-timeout-secs).
	FirstByte time.Duration
	// Stall is how long a worker with requests in flight may send no byte before it is checked
	// with a probe request, which it must answer within the same time (--stall-timeout-secs).
	Stall time.Duration
	// Probe bounds one health probe and one read of /v1/models (--health-check-timeout-secs).
	Probe time.Duration
	// Scrape bounds one scrape of a worker's /metrics: nine tenths of --worker-metrics-interval,
	// so that a scrape ends before the next is due.
	Scrape time.Duration
	// Tokenize bounds one call to a worker's /tokenize (--tokenize-timeout-secs).
	Tokenize time.Duration
}

// The timeouts that are not configured.
const (
	DefaultDial      = 10 * time.Second
	DefaultKeepAlive = 30 * time.Second
	// DefaultIdle is below vLLM's keep-alive; a pooled connection is checked before reuse anyway.
	DefaultIdle = 30 * time.Second
)
