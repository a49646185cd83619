package proxy

import (
	"bytes"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/bodies"
)

// Header names the router reads or writes, in one place.
const (
	HeaderWorker         = "x-vllm-router-worker"         // tenant that served the request: URL or URL@rank, without credentials
	HeaderBaseWorker     = "x-vllm-router-base-worker"    // the tenant's base URL, without credentials
	HeaderDPRank         = "x-vllm-router-dp-rank"        // data-parallel rank, only with data parallelism
	HeaderDecision       = "x-vllm-router-decision"       // the policy's decision label
	HeaderPrefixMatch    = "x-vllm-router-prefix-match"   // predicted cached fraction of the routing text
	HeaderPD             = "x-vllm-router-pd"             // the path of a request under P/D disaggregation (pd.go)
	HeaderPrefillWorker  = "x-vllm-router-prefill-worker" // the prefill worker of a request whose KV was transferred
	HeaderRequestID      = "x-request-id"                 // echoed from the client when valid, or generated
	HeaderDPRankOut      = "X-data-parallel-rank"         // tells a DP worker which rank serves the request
	HeaderRetryAfter     = "Retry-After"
	HeaderForwardedFor   = "X-Forwarded-For"   // the client's address, appended to any the client sent
	HeaderForwardedProto = "X-Forwarded-Proto" // the scheme the client used to reach the router
)

// hopHeaders are meaningful only for one connection and never forwarded (RFC 9110 section 7.6.1).
// Content-Length is not among them but is always recomputed from the body the router sends.
var hopHeaders = [][]byte{
	[]byte("Connection"), []byte("Proxy-Connection"), []byte("Keep-Alive"), []byte("Proxy-Authenticate"),
	[]byte("Proxy-Authorization"), []byte("Te"), []byte("Trailer"), []byte("Transfer-Encoding"), []byte("Upgrade"),
}

// isHop reports whether key is hop-by-hop: one of hopHeaders, or named by a Connection header
// (connection holds the values of every Connection line, each a comma-separated list).
func isHop(key []byte, connection [][]byte) bool {
	for _, h := range hopHeaders {
		if bytes.EqualFold(key, h) {
			return true
		}
	}
	for _, line := range connection {
		for len(line) > 0 {
			var name []byte
			name, line, _ = bytes.Cut(line, []byte(","))
			if bytes.EqualFold(bytes.TrimSpace(name), key) {
				return true
			}
		}
	}
	return false
}

// copyRequestHeaders copies the client's end-to-end headers into the upstream request. Host,
// Content-Length and the framing headers are the upstream request's own.
func copyRequestHeaders(dst, src *fasthttp.RequestHeader) {
	connection := src.PeekAll("Connection")
	for k, v := range src.All() {
		if isHop(k, connection) || bytes.EqualFold(k, []byte("Host")) || bytes.EqualFold(k, []byte("Content-Length")) {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

// copyResponseHeaders copies the worker's end-to-end headers into the client's response. The
// framing (Content-Length or chunked) is set by the relay, and the Date is the router's.
func copyResponseHeaders(dst, src *fasthttp.ResponseHeader) {
	connection := src.PeekAll("Connection")
	for k, v := range src.All() {
		if isHop(k, connection) || bytes.EqualFold(k, []byte("Content-Length")) || bytes.EqualFold(k, []byte("Date")) {
			continue
		}
		dst.AddBytesKV(k, v)
	}
}

// addForwarded tells the worker who the client is: its address appended to X-Forwarded-For, and
// the scheme it used in X-Forwarded-Proto (when the client sent none).
func addForwarded(h *fasthttp.RequestHeader, ctx *fasthttp.RequestCtx) {
	ip := ctx.RemoteIP().String()
	if prior := h.PeekAll(HeaderForwardedFor); len(prior) > 0 {
		// Several lines are one list (RFC 9110 section 5.3): keep every address, in order.
		joined := string(bytes.Join(prior, []byte(", ")))
		h.Del(HeaderForwardedFor)
		h.Set(HeaderForwardedFor, joined+", "+ip)
	} else {
		h.Set(HeaderForwardedFor, ip)
	}
	if len(h.Peek(HeaderForwardedProto)) == 0 {
		if ctx.IsTLS() {
			h.Set(HeaderForwardedProto, "https")
		} else {
			h.Set(HeaderForwardedProto, "http")
		}
	}
}

// requestHeaders lets protocol and reqkey read the client's headers without copying them all.
type requestHeaders struct{ h *fasthttp.RequestHeader }

// Get returns the first value of key, matched case-insensitively.
func (r requestHeaders) Get(key string) string { return string(r.h.Peek(key)) }

// bodyHeaders are a routed request's headers with its body, whose memory the keys read from the
// body are written into (protocol.KeyMemory): the exchange holds the body until its end, past
// every use of the keys.
type bodyHeaders struct {
	requestHeaders
	body *bodies.Body
}

// KeyMemory returns memory for n bytes of a key, the body's.
func (b bodyHeaders) KeyMemory(n int) []byte { return b.body.Scratch(n) }
