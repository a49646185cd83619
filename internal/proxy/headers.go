package proxy

import (
	"net/http"
	"strings"
)

// Header names the router reads or writes, in one place.
const (
	HeaderWorker      = "x-vllm-router-worker"       // tenant that served the request: URL or URL@rank
	HeaderBaseWorker  = "x-vllm-router-base-worker"  // the tenant's base URL
	HeaderDPRank      = "x-vllm-router-dp-rank"      // data-parallel rank, only with data parallelism
	HeaderDecision    = "x-vllm-router-decision"     // the policy's decision label
	HeaderPrefixMatch = "x-vllm-router-prefix-match" // predicted cached fraction of the routing text
	HeaderRequestID   = "x-request-id"               // echoed from the client or generated
	HeaderDPRankOut   = "X-data-parallel-rank"       // tells a DP worker which rank serves the request
	HeaderRetryAfter  = "Retry-After"
)

// hopHeaders are meaningful only for one connection and never forwarded (RFC 9110 section 7.6.1).
var hopHeaders = []string{
	"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade",
}

// copyEndToEnd copies every header of src into dst except hop-by-hop ones, including those that
// src's Connection header names.
func copyEndToEnd(dst, src http.Header) {
	var named []string
	for _, v := range src.Values("Connection") {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				named = append(named, http.CanonicalHeaderKey(f))
			}
		}
	}
outer:
	for k, vv := range src {
		for _, h := range hopHeaders {
			if k == h {
				continue outer
			}
		}
		for _, h := range named {
			if k == h {
				continue outer
			}
		}
		dst[k] = append(dst[k][:0:0], vv...)
	}
}
