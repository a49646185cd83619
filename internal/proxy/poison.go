//go:build cacheroute_poison

package proxy

import "github.com/valyala/fasthttp"

// poison.go is a test build (go test -tags cacheroute_poison): once a request's handler has
// returned, every buffer of the request that a handler could have aliased (its target, path,
// query, header values and body) is overwritten, so that a value kept past its request without a
// copy reads as garbage at once, instead of only when a later request lands at its offset. The
// method and protocol are left alone: fasthttp still reads them to write the answer.
func init() { afterRequest = poisonRequest }

func poisonRequest(ctx *fasthttp.RequestCtx) {
	fill(ctx.Request.Header.RequestURI())
	fill(ctx.URI().PathOriginal())
	fill(ctx.Path())
	fill(ctx.URI().QueryString())
	for _, v := range ctx.QueryArgs().All() {
		fill(v)
	}
	for _, v := range ctx.Request.Header.All() {
		fill(v)
	}
	fill(ctx.Request.Body())
}

func fill(b []byte) {
	for i := range b {
		b[i] = '#'
	}
}
