package telemetry

import (
	"context"
	"testing"
	"time"
)

// fakeHeaders is a Headers over a map, for the nil-tracer path.
type fakeHeaders map[string]string

func (h fakeHeaders) Peek(k string) []byte { return []byte(h[k]) }
func (h fakeHeaders) Set(k, v string)      { h[k] = v }

func clearOTLPEnv(t *testing.T) {
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"} {
		t.Setenv(k, "")
	}
}

func TestTracer_OffIsNilAndCostsNoAllocation(t *testing.T) {
	clearOTLPEnv(t)
	tr, err := NewTracer(t.Context(), TraceOptions{SampleRatio: 1})
	if err != nil || tr != nil {
		t.Fatalf("no endpoint: tracer %v, error %v; want nil, nil", tr, err)
	}
	h := fakeHeaders{}
	start := time.Now()
	allocs := testing.AllocsPerRun(100, func() {
		rt := tr.Start(h, "POST", "/v1/chat/completions", "rid", start)
		rt.Request("m", "session")
		rt.Attempt(1, "http://w")
		rt.Inject(h)
		rt.FirstByte()
		rt.AttemptFailed("connect", "refused")
		rt.Answered(200)
		rt.End(Outcome{Status: 200, StatusClass: "2xx", Attempts: 1})
	})
	if allocs != 0 {
		t.Errorf("tracing off allocates %v times per request", allocs)
	}
	if len(h) != 0 {
		t.Errorf("tracing off wrote headers %v", h)
	}
	if err := tr.Shutdown(t.Context()); err != nil {
		t.Error(err)
	}
}

func TestTracer_EndpointSchemes(t *testing.T) {
	clearOTLPEnv(t)
	for _, ep := range []string{"http://127.0.0.1:4318", "https://collector.example:4318/custom/path", "grpc://127.0.0.1:4317", "grpcs://collector.example:4317"} {
		tr, err := NewTracer(t.Context(), TraceOptions{Endpoint: ep, SampleRatio: 1})
		if err != nil || tr == nil {
			t.Errorf("%s: tracer %v, error %v", ep, tr, err)
			continue
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_ = tr.Shutdown(ctx) // nothing queued: nothing to send
		cancel()
	}
	for _, ep := range []string{"ftp://127.0.0.1:21", "localhost:4318"} {
		if _, err := NewTracer(t.Context(), TraceOptions{Endpoint: ep, SampleRatio: 1}); err == nil {
			t.Errorf("%s: accepted", ep)
		}
	}
}

func TestTracer_EnvironmentEndpointTurnsTracingOn(t *testing.T) {
	clearOTLPEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "http://127.0.0.1:4318/v1/traces")
	tr, err := NewTracer(t.Context(), TraceOptions{SampleRatio: 1})
	if err != nil || tr == nil {
		t.Fatalf("tracer %v, error %v", tr, err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), time.Second)
	defer cancel()
	_ = tr.Shutdown(ctx)
}
