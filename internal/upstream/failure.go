package upstream

import (
	"errors"
	"net"
	"net/http"

	"github.com/valyala/fasthttp"
)

// The kinds of failure, the values of upstream_errors_total{kind}.
const (
	KindConnect   = "connect"      // the worker could not be reached: dial refused, unreachable, timed out
	KindReset     = "reset"        // a connection closed or reset before the worker could have read the request
	KindFirstByte = "first_byte"   // no response headers within --first-byte-timeout-secs
	KindTimeout   = "timeout"      // --request-timeout-secs passed
	KindStatus    = "status_5xx"   // the worker answered 502, 503 or 504 before anything was sent
	KindSent      = "after_send"   // the connection failed after the request was written: not retried
	KindMidStream = "mid_stream"   // the response broke after bytes reached the client
	KindBadReply  = "bad_response" // the worker's response could not be parsed
	KindStalled   = "stalled"      // the worker was found stalled before any byte of the answer came
)

// Kinds are every kind of failure; each has its upstream_errors_total series from the start.
var Kinds = []string{KindConnect, KindReset, KindFirstByte, KindTimeout, KindStatus, KindSent, KindMidStream, KindBadReply, KindStalled}

// dialError marks a failure to connect: nothing reached the worker.
type dialError struct{ err error }

func (e *dialError) Error() string { return e.err.Error() }
func (e *dialError) Unwrap() error { return e.err }

// Failure is how one call failed, decided from the error and the connection's record.
type Failure struct {
	Kind      string // upstream_errors_total{kind}; "" for a call that was cut before it began
	Retryable bool   // provably nothing was generated: another worker may take the request
	Message   string // for the client; never a socket address
	// stale: a pooled connection the worker had closed; the same worker may take the request
	// again at once (Send does).
	stale bool
}

// classify applies the retry rule: retry only what provably did not start generating.
func classify(err error, c *Conn, requestTimedOut bool) Failure {
	var de *dialError
	switch {
	case errors.Is(err, errStalled):
		// Nothing of the answer came, so nothing reached the client: another worker may take it.
		return Failure{Kind: KindStalled, Retryable: true, Message: "the worker stalled: no progress on its requests and no answer to a probe request"}
	case errors.As(err, &de):
		if IsTimeout(de.err) {
			return Failure{Kind: KindConnect, Retryable: true, Message: "connecting to the worker timed out"}
		}
		return Failure{Kind: KindConnect, Retryable: true, Message: "the worker refused the connection or could not be reached"}
	case requestTimedOut:
		return Failure{Kind: KindTimeout, Message: "the worker did not answer within the request timeout"}
	case c == nil:
		return Failure{Kind: KindConnect, Retryable: true, Message: "the worker could not be reached"}
	case !c.wrote:
		// The request never fully reached the worker, which cannot act on a partial JSON body.
		return Failure{Kind: KindReset, Retryable: true, stale: c.reused, Message: "the connection to the worker closed before the request was sent"}
	case c.read > 0 && IsTimeout(err):
		// classify sees only failures before the answer's headers were whole: a worker that
		// began them but did not finish within the first-byte timeout sent the client nothing.
		return Failure{Kind: KindFirstByte, Retryable: true, Message: "the worker did not send its response headers within the first-byte timeout"}
	case c.read > 0:
		return Failure{Kind: KindBadReply, Message: "the worker's answer could not be read"}
	case IsTimeout(err):
		return Failure{Kind: KindFirstByte, Retryable: true, Message: "the worker did not start answering within the first-byte timeout"}
	case c.reused:
		// A pooled connection closed before a single byte of the answer: the worker had closed it
		// while idle, and never read this request.
		return Failure{Kind: KindReset, Retryable: true, stale: true, Message: "the worker closed an idle connection"}
	default:
		return Failure{Kind: KindSent, Message: "the worker closed the connection after receiving the request"}
	}
}

// RetryableStatus reports the worker answers that mean "try another worker": bad gateway,
// unavailable, gateway timeout. Every other status is the worker's real answer.
func RetryableStatus(status int) bool {
	return status == http.StatusBadGateway || status == http.StatusServiceUnavailable || status == http.StatusGatewayTimeout
}

// IsTimeout reports whether err is a deadline that passed, on a connection or in fasthttp.
func IsTimeout(err error) bool {
	if errors.Is(err, fasthttp.ErrTimeout) {
		return true
	}
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}
