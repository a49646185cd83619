package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"

	"github.com/valyala/fasthttp"
)

// plain.go runs the net/http handlers (health, models, metrics, admin, status page) on the
// fasthttp listener. fasthttp reuses a request's buffers for the next request it reads, so the
// *http.Request such a handler gets is built from copies only: its method, target, host, headers
// and body are its own, and a handler may keep any of them (a worker URL from ?url=) without the
// next request rewriting it. Its context is its own too, ended when the handler returns. The
// handler runs to its end before the fasthttp handler returns; its answer is buffered, then copied
// into the fasthttp response. None of these handlers streams, so nothing is lost by buffering.

// servePlain returns the fasthttp handler that runs h on a copy of each request.
func servePlain(h http.Handler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		r, err := copyRequest(ctx)
		if err != nil {
			writeFastError(ctx, openAIErrors, fasthttp.StatusBadRequest, "invalid_request_error", "bad_request", "malformed request target")
			return
		}
		c, cancel := context.WithCancel(context.Background())
		w := &bufferedAnswer{header: http.Header{}}
		h.ServeHTTP(w, r.WithContext(c))
		cancel()
		w.copyTo(&ctx.Response)
	}
}

// copyRequest returns the net/http form of the request in ctx, sharing no memory with it.
func copyRequest(ctx *fasthttp.RequestCtx) (*http.Request, error) {
	target := string(ctx.RequestURI())
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return nil, err
	}
	body := bytes.Clone(ctx.PostBody())
	r := &http.Request{
		Method:        string(ctx.Method()),
		URL:           u,
		Proto:         "HTTP/1.1",
		ProtoMajor:    1,
		ProtoMinor:    1,
		Header:        http.Header{},
		Body:          io.NopCloser(bytes.NewReader(body)),
		ContentLength: int64(len(body)),
		Host:          string(ctx.Host()),
		RemoteAddr:    ctx.RemoteAddr().String(),
		RequestURI:    target,
		TLS:           ctx.TLSConnectionState(),
	}
	if !ctx.Request.Header.IsHTTP11() {
		r.Proto, r.ProtoMinor = "HTTP/1.0", 0
	}
	for k, v := range ctx.Request.Header.All() {
		if name := string(k); name != fasthttp.HeaderHost {
			r.Header.Add(name, string(v))
		}
	}
	return r, nil
}

// bufferedAnswer is the http.ResponseWriter of a plain handler: it keeps the status, headers and
// body until the handler returns.
type bufferedAnswer struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (a *bufferedAnswer) Header() http.Header { return a.header }

func (a *bufferedAnswer) WriteHeader(status int) {
	if a.status == 0 && status >= 200 {
		a.status = status
	}
}

func (a *bufferedAnswer) Write(p []byte) (int, error) {
	a.WriteHeader(http.StatusOK)
	return a.body.Write(p)
}

// copyTo writes the answer into resp. Its framing is fasthttp's, from the body; a body without a
// Content-Type gets one sniffed from its first bytes, as net/http would.
func (a *bufferedAnswer) copyTo(resp *fasthttp.Response) {
	resp.SetStatusCode(max(a.status, http.StatusOK))
	for k, vs := range a.header {
		if k == fasthttp.HeaderContentLength || k == fasthttp.HeaderTransferEncoding {
			continue
		}
		for _, v := range vs {
			resp.Header.Add(k, v)
		}
	}
	if len(a.header.Values(fasthttp.HeaderContentType)) == 0 && a.body.Len() > 0 {
		resp.Header.SetContentType(http.DetectContentType(a.body.Bytes()))
	}
	resp.SetBody(a.body.Bytes())
}
