package proxy

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/cacheroute/cacheroute/internal/telemetry"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// A traced router records, per routed request, a server span with a "route" child (reading and
// placing the request) and one client span per upstream attempt, and hands the attempt's trace
// context to the worker.

// tracedProxy is a test router whose spans go to an in-process recorder.
func tracedProxy(t *testing.T, urls ...string) (*testProxy, *tracetest.SpanRecorder) {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(t.Context()) })
	opts := testOptions()
	opts.Tracer = telemetry.NewTracerFrom(tp)
	return newTestProxy(t, setup{opts: &opts, urls: urls}), rec
}

// ended waits for n ended spans (a relayed answer's spans end after the client has its body).
func ended(t *testing.T, rec *tracetest.SpanRecorder, n int) []sdktrace.ReadOnlySpan {
	t.Helper()
	testkit.WaitWithin(t, 5*time.Second, fmt.Sprintf("%d spans ended", n), func() bool { return len(rec.Ended()) >= n })
	return rec.Ended()
}

func byName(spans []sdktrace.ReadOnlySpan, name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range spans {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

func attr(s sdktrace.ReadOnlySpan, key string) (attribute.Value, bool) {
	for _, kv := range s.Attributes() {
		if string(kv.Key) == key {
			return kv.Value, true
		}
	}
	return attribute.Value{}, false
}

func hasEvent(s sdktrace.ReadOnlySpan, name string) bool {
	for _, e := range s.Events() {
		if e.Name == name {
			return true
		}
	}
	return false
}

func TestTracing_SpanTreeAttributesAndPropagation(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{"ok":true}`)
	tp, rec := tracedProxy(t, w.URL)
	const session = "secret-session-id-42"
	if status, _, body := tp.post(t, chatPath, chatBody, "x-session-id", session); status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	spans := ended(t, rec, 3)
	server := byName(spans, "POST "+chatPath)
	decide := byName(spans, "route")
	up := byName(spans, "upstream")
	if len(server) != 1 || len(decide) != 1 || len(up) != 1 {
		t.Fatalf("spans %d server, %d route, %d upstream; want one each", len(server), len(decide), len(up))
	}
	srv := server[0]
	if srv.SpanKind() != trace.SpanKindServer || up[0].SpanKind() != trace.SpanKindClient {
		t.Errorf("kinds: server span %v, attempt span %v", srv.SpanKind(), up[0].SpanKind())
	}
	if srv.Parent().IsValid() {
		t.Errorf("a request without traceparent got a parent %v", srv.Parent())
	}
	for _, child := range []sdktrace.ReadOnlySpan{decide[0], up[0]} {
		if child.Parent().SpanID() != srv.SpanContext().SpanID() || child.SpanContext().TraceID() != srv.SpanContext().TraceID() {
			t.Errorf("span %q is not a child of the server span", child.Name())
		}
	}
	want := map[string]string{
		"http.route":           chatPath,
		"gen_ai.request.model": "m",
		"cacheroute.worker":    tp.worker(t, w.URL).Name(),
	}
	for k, v := range want {
		if got, ok := attr(srv, k); !ok || got.AsString() != v {
			t.Errorf("server span %s = %q, want %q", k, got.Emit(), v)
		}
	}
	// The session attribute is the access log's hash of the session key, never the id itself.
	if got, ok := attr(srv, "cacheroute.session"); !ok || len(got.AsString()) != 12 {
		t.Errorf("server span session %q, want a 12-digit hash", got.Emit())
	}
	for _, k := range []string{"cacheroute.decision", "cacheroute.prefix_match"} {
		if _, ok := attr(srv, k); !ok {
			t.Errorf("server span has no %s", k)
		}
	}
	if got, _ := attr(srv, "http.response.status_code"); got.AsInt64() != 200 {
		t.Errorf("status attribute %v", got.Emit())
	}
	if got, _ := attr(srv, "cacheroute.attempts"); got.AsInt64() != 1 {
		t.Errorf("attempts attribute %v", got.Emit())
	}
	if srv.Status().Code == codes.Error {
		t.Errorf("a 200 marked as an error: %v", srv.Status())
	}
	if !hasEvent(up[0], "first_byte") || !hasEvent(up[0], "stream_end") {
		t.Errorf("attempt events %v, want first_byte and stream_end", up[0].Events())
	}
	noSessionID(t, spans, session)

	seen := w.headerValues("traceparent")
	if len(seen) != 1 {
		t.Fatalf("worker saw %d requests", len(seen))
	}
	sc := up[0].SpanContext()
	if wantTP := fmt.Sprintf("00-%s-%s-01", sc.TraceID(), sc.SpanID()); seen[0] != wantTP {
		t.Errorf("worker got traceparent %q, want the attempt's %q", seen[0], wantTP)
	}
}

// noSessionID fails when the raw session id appears in any attribute or event of any span.
func noSessionID(t *testing.T, spans []sdktrace.ReadOnlySpan, id string) {
	t.Helper()
	for _, s := range spans {
		kvs := s.Attributes()
		for _, e := range s.Events() {
			kvs = append(kvs, e.Attributes...)
		}
		for _, kv := range kvs {
			if strings.Contains(kv.Value.Emit(), id) {
				t.Errorf("span %q carries the session id in %s", s.Name(), kv.Key)
			}
		}
	}
}

func TestTracing_IncomingTraceparentIsContinued(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{"ok":true}`)
	tp, rec := tracedProxy(t, w.URL)
	const traceID, parentID = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	if status, _, _ := tp.post(t, chatPath, chatBody, "traceparent", "00-"+traceID+"-"+parentID+"-01", "tracestate", "vendor=x"); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	spans := ended(t, rec, 3)
	srv := byName(spans, "POST "+chatPath)[0]
	if srv.SpanContext().TraceID().String() != traceID || srv.Parent().SpanID().String() != parentID {
		t.Errorf("server span in trace %s under %s, want %s under %s", srv.SpanContext().TraceID(), srv.Parent().SpanID(), traceID, parentID)
	}
	seen := w.headerValues("traceparent")
	if !strings.HasPrefix(seen[0], "00-"+traceID+"-") || strings.Contains(seen[0], parentID) {
		t.Errorf("worker got traceparent %q, want trace %s with the router's span as parent", seen[0], traceID)
	}
}

func TestTracing_RetriesAreSiblingAttempts(t *testing.T) {
	bad := newRecordingWorker(t, http.StatusServiceUnavailable, `{"ok":true}`)
	good := newRecordingWorker(t, http.StatusOK, `{"ok":true}`)
	tp, rec := tracedProxy(t, bad.URL, good.URL)
	if status, _, _ := tp.post(t, chatPath, chatBody); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	spans := ended(t, rec, 4)
	srv := byName(spans, "POST "+chatPath)[0]
	up := byName(spans, "upstream")
	if len(up) != 2 {
		t.Fatalf("%d attempt spans, want 2", len(up))
	}
	for i, s := range up {
		if s.Parent().SpanID() != srv.SpanContext().SpanID() {
			t.Errorf("attempt %d is not a child of the server span", i)
		}
		if n, _ := attr(s, "cacheroute.attempt"); n.AsInt64() != int64(i+1) {
			t.Errorf("attempt span %d numbered %v", i, n.Emit())
		}
	}
	if up[0].Status().Code != codes.Error || up[1].Status().Code == codes.Error {
		t.Errorf("attempt statuses %v, %v: want the 503 an error and the 200 not", up[0].Status(), up[1].Status())
	}
	if got, _ := attr(srv, "cacheroute.attempts"); got.AsInt64() != 2 {
		t.Errorf("attempts attribute %v", got.Emit())
	}
	badSeen, goodSeen := bad.headerValues("traceparent"), good.headerValues("traceparent")
	if len(badSeen) != 1 || len(goodSeen) != 1 || badSeen[0] == goodSeen[0] {
		t.Errorf("traceparents %v then %v: want one per attempt, each its own span", badSeen, goodSeen)
	}
}

func TestTracing_UpstreamFailureIsAnError(t *testing.T) {
	bad := newRecordingWorker(t, http.StatusBadGateway, `{"ok":true}`)
	opts := testOptions()
	opts.MaxRetries = 0
	rec := tracetest.NewSpanRecorder()
	provider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	opts.Tracer = telemetry.NewTracerFrom(provider)
	tp := newTestProxy(t, setup{opts: &opts, urls: []string{closedPort(t), bad.URL}})
	status, _, _ := tp.post(t, chatPath, chatBody)
	if status < 500 {
		t.Fatalf("status %d", status)
	}
	spans := ended(t, rec, 3)
	srv := byName(spans, "POST "+chatPath)[0]
	if srv.Status().Code != codes.Error {
		t.Errorf("server span of a %d has status %v", status, srv.Status())
	}
	for _, s := range byName(spans, "upstream") {
		if s.Status().Code != codes.Error {
			t.Errorf("failed attempt span has status %v", s.Status())
		}
	}
}

func TestTracing_CutStreamIsAnError(t *testing.T) {
	w := testkit.NewServer(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"i\":0}\n\n")
		w.(http.Flusher).Flush()
		if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
			_ = c.Close()
		}
	})
	tp, rec := tracedProxy(t, w.URL)
	if _, _, err := tp.readAll(t, streamBody); err == nil {
		t.Fatal("the client read a clean end of a broken stream")
	}
	spans := ended(t, rec, 3)
	srv := byName(spans, "POST "+chatPath)[0]
	if srv.Status().Code != codes.Error {
		t.Errorf("server span of a cut stream has status %v", srv.Status())
	}
	if c, _ := attr(srv, "cacheroute.status_class"); c.AsString() != "cut" {
		t.Errorf("status class %q", c.AsString())
	}
	up := byName(spans, "upstream")[0]
	if up.Status().Code != codes.Error || !hasEvent(up, "first_byte") || !hasEvent(up, "stream_end") {
		t.Errorf("attempt span status %v, events %v", up.Status(), up.Events())
	}
}

func TestTracing_OffSendsTheClientsTraceparentUnchanged(t *testing.T) {
	w := newRecordingWorker(t, http.StatusOK, `{"ok":true}`)
	tp := newTestProxy(t, setup{urls: []string{w.URL}})
	const given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if status, _, _ := tp.post(t, chatPath, chatBody, "traceparent", given); status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	if seen := w.headerValues("traceparent"); seen[0] != given {
		t.Errorf("worker got %q, want the client's %q", seen[0], given)
	}
}
