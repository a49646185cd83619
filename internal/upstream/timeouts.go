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
	// Tokenize bounds one call to a worker's /tokenize (--tokenize-timeout-secs), and
	// TokenizePerKiB is added to it for each KiB asked (--tokenize-timeout-per-kib-ms): see
	// TokenizeFor.
	Tokenize, TokenizePerKiB time.Duration
	// Lookup bounds one lookup of a stored response (GET /v1/responses/{id}) in a search for a
	// response the router does not know: a worker answers it from its memory, so one that takes
	// longer is failing, and the search does not wait on it longer than this.
	Lookup time.Duration
}

// TokenizeFor bounds one /tokenize call of size bytes: Tokenize, plus TokenizePerKiB for each KiB
// begun; no bound when Tokenize is 0. An engine renders and tokenizes the whole prompt, and the
// router reads one number per token, so the call's time grows with the prompt (about 0.2 ms per
// KiB against the simulator; a real engine's template and tokenizer take their own time): a fixed
// bound would cut every long prompt off, and route exactly the requests whose placement matters
// most (the longest prefills) without the events. The body's bound (--max-payload-size) bounds
// the wait.
func (t Timeouts) TokenizeFor(size int) time.Duration {
	if t.Tokenize <= 0 {
		return 0
	}
	return t.Tokenize + t.TokenizePerKiB*time.Duration((size+1023)/1024)
}

// The timeouts that are not configured.
const (
	DefaultDial      = 10 * time.Second
	DefaultKeepAlive = 30 * time.Second
	// DefaultIdle is below vLLM's keep-alive; a pooled connection is checked before reuse anyway.
	DefaultIdle = 30 * time.Second
	// DefaultLookup is the bound of one stored-response lookup (Timeouts.Lookup).
	DefaultLookup = 10 * time.Second
)
