package telemetry

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
)

// otlpClient sends the SDK's spans, already in OTLP's protobuf form (the otlptrace exporter
// converts them), to a collector over OTLP/HTTP. It is the router's own so that the binary does
// not link gRPC: the SDK's OTLP/HTTP exporter and the generated collector package both import it.
type otlpClient struct {
	s    exportSettings
	http *http.Client
}

// maxResponseBytes bounds what is read of a collector's answer: its body is only read to reuse
// the connection and to quote the start of an error.
const maxResponseBytes = 64 << 10

// Retries of an export back off from firstRetryWait, doubling up to maxRetryWait, within the
// export's timeout; a collector's Retry-After is followed when it fits in that time.
const (
	firstRetryWait = 500 * time.Millisecond
	maxRetryWait   = 5 * time.Second
)

func newOTLPClient(s exportSettings) *otlpClient {
	t := http.DefaultTransport.(*http.Transport).Clone()
	if s.tls != nil {
		t.TLSClientConfig = s.tls
	}
	return &otlpClient{s: s, http: &http.Client{Transport: t}}
}

// Start does nothing: connections are made by the first export.
func (c *otlpClient) Start(context.Context) error { return nil }

// Stop closes the idle connections to the collector.
func (c *otlpClient) Stop(context.Context) error {
	c.http.CloseIdleConnections()
	return nil
}

// UploadTraces sends one batch of spans, retrying what the collector or the network says may
// succeed later (429, 502, 503, 504 and transport errors) until the export's timeout.
func (c *otlpClient) UploadTraces(ctx context.Context, spans []*tracepb.ResourceSpans) error {
	body, err := c.encode(spans)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.s.timeout)
	defer cancel()
	wait := firstRetryWait
	for {
		retryAfter, err := c.post(ctx, body)
		if err == nil || retryAfter < 0 {
			return err
		}
		if retryAfter == 0 {
			retryAfter, wait = wait, min(2*wait, maxRetryWait)
		}
		if deadline, _ := ctx.Deadline(); time.Until(deadline) < retryAfter {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(retryAfter):
		}
	}
}

// post sends body once. On an error it also says whether to retry: a negative wait is never,
// zero is after the backoff's next wait, more is the wait the collector asked for.
func (c *otlpClient) post(ctx context.Context, body []byte) (time.Duration, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.s.url, bytes.NewReader(body))
	if err != nil {
		return -1, err
	}
	req.Header.Set("Content-Type", "application/x-protobuf")
	req.Header.Set("User-Agent", "cacheroute")
	if c.s.gzip {
		req.Header.Set("Content-Encoding", "gzip")
	}
	for _, h := range c.s.headers {
		req.Header.Set(h[0], h[1])
	}
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return -1, err
		}
		return 0, err
	}
	defer resp.Body.Close()
	start, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxResponseBytes-int64(len(start))))
	if resp.StatusCode/100 == 2 {
		return 0, nil
	}
	err = fmt.Errorf("OTLP/HTTP export to %s: %s: %q", c.s.url, resp.Status, start)
	switch resp.StatusCode {
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		if secs, perr := strconv.Atoi(resp.Header.Get("Retry-After")); perr == nil && secs > 0 {
			return time.Duration(secs) * time.Second, err
		}
		return 0, err
	}
	return -1, err
}

// encode writes an ExportTraceServiceRequest: its one field, 1, repeats the resource spans. It
// is written here rather than by the generated collector package, which imports gRPC.
func (c *otlpClient) encode(spans []*tracepb.ResourceSpans) ([]byte, error) {
	var b []byte
	for _, rs := range spans {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(proto.Size(rs)))
		var err error
		if b, err = (proto.MarshalOptions{UseCachedSize: true}).MarshalAppend(b, rs); err != nil {
			return nil, err
		}
	}
	if !c.s.gzip {
		return b, nil
	}
	var z bytes.Buffer
	w := gzip.NewWriter(&z)
	if _, err := w.Write(b); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return z.Bytes(), nil
}
