//go:build cacheroute_poison

package proxy

import "github.com/valyala/fasthttp"

// poison.go is a test build (go test -tags cacheroute_poison): once a request's handler has
// returned, every buffer of the request that a handler could have aliased (its target, path,
// query, header values and body) is overwritten, so that a value kept past its request without a
// copy reads as garbage at once, instead of only when a later request lands at its offset. Only
// the request's own bytes are: values fasthttp shares between requests are left alone, and so are
// the method and protocol, which fasthttp still reads to write the answer.
func init() { afterRequest = poisonRequest }

func poisonRequest(ctx *fasthttp.RequestCtx) {
	fill(ctx.Request.Header.RequestURI())
	fill(ctx.URI().PathOriginal())
	fill(ctx.Path())
	fill(ctx.URI().QueryString())
	for _, v := range ctx.QueryArgs().All() {
		fill(v)
	}
	h := &ctx.Request.Header
	for k, v := range h.All() {
		if !connectionCloseFlag(h, k, v) {
			fill(v)
		}
	}
	fill(ctx.Request.Body())
}

// connectionCloseFlag reports whether a header pair from RequestHeader.All is the one fasthttp
// makes up for a request that asked to close its connection ("Connection: close", or HTTP/1.0
// without keep-alive): it keeps that as a flag, and its value is fasthttp's one "close" shared by
// every request, not a byte of this request's buffers. Overwriting it would race with every other
// request and corrupt the value for them.
func connectionCloseFlag(h *fasthttp.RequestHeader, key, value []byte) bool {
	return h.ConnectionClose() && string(key) == fasthttp.HeaderConnection && string(value) == "close"
}

func fill(b []byte) {
	for i := range b {
		b[i] = '#'
	}
}
