package telemetry

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
)

// TraceOptions configure the OTLP trace export. With neither Endpoint nor one of the
// OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT variables set, tracing is off.
type TraceOptions struct {
	// Endpoint is where spans go, over OTLP/HTTP: http:// or https://, the path defaulting to
	// /v1/traces. Empty: the OTEL_EXPORTER_OTLP_* variables decide.
	Endpoint string
	// SampleRatio is the fraction of new traces recorded; a request that arrives with a trace
	// context follows its caller's sampling decision.
	SampleRatio float64
	// Version is the router's version, for the service.version resource attribute.
	Version string
}

// Enabled reports whether o, with the process environment, asks for traces.
func (o TraceOptions) Enabled() bool {
	_, env := firstSet("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
	return o.Endpoint != "" || env != ""
}

// Tracer makes the spans of routed requests. A nil *Tracer is tracing off: its methods do
// nothing and return nil, so the request path pays one pointer test.
type Tracer struct {
	t        trace.Tracer
	prop     propagation.TraceContext
	shutdown func(context.Context) error
}

// NewTracer starts the OTLP exporter o describes; it returns nil, nil when tracing is off.
func NewTracer(ctx context.Context, o TraceOptions) (*Tracer, error) {
	if !o.Enabled() {
		return nil, nil
	}
	settings, err := readExportSettings(o.Endpoint)
	if err != nil {
		return nil, err
	}
	exp, err := otlptrace.New(ctx, newOTLPClient(settings))
	if err != nil {
		return nil, err
	}
	attrs := []attribute.KeyValue{attribute.String("service.name", "cacheroute")}
	if o.Version != "" {
		attrs = append(attrs, attribute.String("service.version", o.Version))
	}
	// The environment (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) overrides the defaults.
	res, err := resource.Merge(resource.NewSchemaless(attrs...), resource.Environment())
	if err != nil {
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(
		sdktrace.WithBatcher(exp),
		sdktrace.WithResource(res),
		sdktrace.WithSampler(sdktrace.ParentBased(sdktrace.TraceIDRatioBased(o.SampleRatio))),
	)
	t := NewTracerFrom(tp)
	t.shutdown = tp.Shutdown
	return t, nil
}

// NewTracerFrom makes spans with tp (tests give it a recorder).
func NewTracerFrom(tp trace.TracerProvider) *Tracer {
	return &Tracer{
		t:    tp.Tracer("github.com/cacheroute/cacheroute/internal/telemetry"),
		prop: propagation.TraceContext{},
	}
}

// Shutdown exports the spans still queued, within ctx.
func (t *Tracer) Shutdown(ctx context.Context) error {
	if t == nil || t.shutdown == nil {
		return nil
	}
	return t.shutdown(ctx)
}

// Headers reads and writes request headers for trace context propagation.
type Headers interface {
	Peek(key string) []byte
	Set(key, value string)
}

// carrier adapts Headers to the propagators.
type carrier struct{ h Headers }

func (c carrier) Get(key string) string { return string(c.h.Peek(key)) }
func (c carrier) Set(key, value string) { c.h.Set(key, value) }
func (c carrier) Keys() []string        { return nil }

// RequestTrace holds the spans of one routed request: the server span, the span of reading and
// placing it, and the client span of the attempt in flight. A nil *RequestTrace does nothing.
type RequestTrace struct {
	t       *Tracer
	ctx     context.Context // carries the server span
	span    trace.Span
	decide  trace.Span
	attempt trace.Span
	// attrs gathers the server span's attributes, set at once when it ends: one call into the
	// SDK rather than one per fact.
	attrs []attribute.KeyValue
}

// Start begins the server span of a request, continuing the trace its W3C traceparent names, if
// any, and the span of reading and placing it.
func (t *Tracer) Start(in Headers, method, route, requestID string, start time.Time) *RequestTrace {
	if t == nil {
		return nil
	}
	parent := t.prop.Extract(context.Background(), carrier{in})
	ctx, span := t.t.Start(parent, method+" "+route, trace.WithSpanKind(trace.SpanKindServer), trace.WithTimestamp(start))
	rt := &RequestTrace{t: t, ctx: ctx, span: span, attrs: make([]attribute.KeyValue, 0, 12)}
	rt.attrs = append(rt.attrs,
		attribute.String("http.request.method", method),
		attribute.String("http.route", route),
		attribute.String("cacheroute.request_id", requestID))
	_, rt.decide = t.t.Start(ctx, "route", trace.WithTimestamp(start))
	return rt
}

// Request records what the request is: its model and the hash of its session key (never the key).
func (rt *RequestTrace) Request(model, sessionKey string) {
	if rt == nil {
		return
	}
	rt.attrs = append(rt.attrs, attribute.String("gen_ai.request.model", model))
	if h := SessionHash(sessionKey); h != "" {
		rt.attrs = append(rt.attrs, attribute.String("cacheroute.session", h))
	}
}

// Decided ends the span of reading and placing the request at its first decision.
func (rt *RequestTrace) Decided() {
	if rt == nil || rt.decide == nil {
		return
	}
	rt.decide.End()
	rt.decide = nil
}

// Attempt begins the client span of one upstream attempt, a sibling of any earlier attempt.
func (rt *RequestTrace) Attempt(n int, worker string) {
	if rt == nil {
		return
	}
	rt.Decided()
	rt.endAttempt()
	_, rt.attempt = rt.t.t.Start(rt.ctx, "upstream", trace.WithSpanKind(trace.SpanKindClient),
		trace.WithAttributes(attribute.Int("cacheroute.attempt", n), attribute.String("cacheroute.worker", worker)))
}

// Inject writes the attempt's trace context (traceparent, tracestate) into the upstream request,
// replacing any the client sent, so the worker's spans join the trace.
func (rt *RequestTrace) Inject(out Headers) {
	if rt == nil || rt.attempt == nil {
		return
	}
	rt.t.prop.Inject(trace.ContextWithSpan(rt.ctx, rt.attempt), carrier{out})
}

// AttemptFailed ends the attempt in flight as a failure of the kind given.
func (rt *RequestTrace) AttemptFailed(kind, message string) {
	if rt == nil || rt.attempt == nil {
		return
	}
	rt.attempt.SetAttributes(attribute.String("error.type", kind))
	rt.attempt.SetStatus(codes.Error, message)
	rt.endAttempt()
}

// Answered records the worker's status on the attempt whose answer is relayed.
func (rt *RequestTrace) Answered(status int) {
	if rt == nil || rt.attempt == nil {
		return
	}
	rt.attempt.SetAttributes(attribute.Int("http.response.status_code", status))
	if status >= 500 {
		rt.attempt.SetStatus(codes.Error, "")
	}
}

// FirstByte marks the first byte of the answer's body on the attempt.
func (rt *RequestTrace) FirstByte() {
	if rt == nil || rt.attempt == nil {
		return
	}
	rt.attempt.AddEvent("first_byte")
}

func (rt *RequestTrace) endAttempt() {
	if rt.attempt != nil {
		rt.attempt.End()
		rt.attempt = nil
	}
}

// Outcome is how a request ended, for its server span.
type Outcome struct {
	Status      int    // the status sent to the client (499: the client left first)
	StatusClass string // as requests_total counts it: 2xx … 5xx, or cut
	Attempts    int
	Decision    string
	Worker      string // without credentials
	Match       float64
	Bytes       int64 // the answer's body bytes relayed
	Err         string
}

// End ends the request's spans: the attempt in flight with a stream-end event, then the server
// span, marked as an error for a 5xx, a cut answer or a failed worker.
func (rt *RequestTrace) End(o Outcome) {
	if rt == nil {
		return
	}
	rt.Decided()
	cut := o.StatusClass == "cut"
	if rt.attempt != nil {
		rt.attempt.AddEvent("stream_end", trace.WithAttributes(attribute.Int64("cacheroute.bytes", o.Bytes)))
		if cut {
			rt.attempt.SetStatus(codes.Error, o.Err)
		}
		rt.endAttempt()
	}
	s := rt.span
	rt.attrs = append(rt.attrs, attribute.Int("http.response.status_code", o.Status), attribute.Int("cacheroute.attempts", o.Attempts))
	if cut {
		rt.attrs = append(rt.attrs, attribute.String("cacheroute.status_class", o.StatusClass))
	}
	if o.Decision != "" {
		rt.attrs = append(rt.attrs, attribute.String("cacheroute.decision", o.Decision))
	}
	if o.Worker != "" {
		rt.attrs = append(rt.attrs, attribute.String("cacheroute.worker", o.Worker), attribute.Float64("cacheroute.prefix_match", o.Match))
	}
	s.SetAttributes(rt.attrs...)
	if cut || o.Status >= 500 {
		msg := o.Err
		if msg == "" {
			msg = o.StatusClass
		}
		s.SetStatus(codes.Error, msg)
	}
	s.End()
}
