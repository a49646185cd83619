package telemetry

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// fakeHeaders is a Headers over a map, for the nil-tracer path.
type fakeHeaders map[string]string

func (h fakeHeaders) Peek(k string) []byte { return []byte(h[k]) }
func (h fakeHeaders) Set(k, v string)      { h[k] = v }

// clearOTLPEnv unsets, for the test, every variable the exporter reads.
func clearOTLPEnv(t *testing.T) {
	for _, suffix := range []string{"ENDPOINT", "PROTOCOL", "HEADERS", "TIMEOUT", "COMPRESSION", "CERTIFICATE", "CLIENT_CERTIFICATE", "CLIENT_KEY"} {
		t.Setenv("OTEL_EXPORTER_OTLP_"+suffix, "")
		t.Setenv("OTEL_EXPORTER_OTLP_TRACES_"+suffix, "")
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
	for _, ep := range []string{"http://127.0.0.1:4318", "https://127.0.0.1:4318/custom/path", "http://[::1]:4318/"} {
		tr, err := NewTracer(t.Context(), TraceOptions{Endpoint: ep, SampleRatio: 1})
		if err != nil || tr == nil {
			t.Errorf("%s: tracer %v, error %v", ep, tr, err)
			continue
		}
		ctx, cancel := context.WithTimeout(t.Context(), time.Second)
		_ = tr.Shutdown(ctx) // nothing queued: nothing to send
		cancel()
	}
	for _, ep := range []string{"ftp://127.0.0.1:21", "localhost:4318", "http://", "http://127.0.0.1:4318/%zz"} {
		if _, err := NewTracer(t.Context(), TraceOptions{Endpoint: ep, SampleRatio: 1}); err == nil {
			t.Errorf("%s: accepted", ep)
		}
	}
}

// OTLP/gRPC is not exported: an endpoint that asks for it stops the start with the OTLP/HTTP
// port to use, rather than sending OTLP/HTTP to a gRPC listener that refuses every export.
func TestTracer_GRPCEndpointIsRefusedWithTheHTTPPort(t *testing.T) {
	clearOTLPEnv(t)
	for _, ep := range []string{"grpc://127.0.0.1:4317", "grpcs://127.0.0.1:4317", "http://127.0.0.1:4317", "https://localhost:4317/v1/traces", "127.0.0.1:4317"} {
		_, err := NewTracer(t.Context(), TraceOptions{Endpoint: ep, SampleRatio: 1})
		if err == nil {
			t.Errorf("%s: accepted", ep)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "--otlp-traces-endpoint") || !strings.Contains(msg, "OTLP/HTTP") || !strings.Contains(msg, "4318") {
			t.Errorf("%s: error %q does not name the flag and point to OTLP/HTTP on 4318", ep, msg)
		}
	}
}

// A variable that asks for OTLP/gRPC, or for anything else the exporter cannot honour, stops the
// start with an error naming it, rather than being ignored.
func TestTracer_EnvironmentItCannotHonourStopsTheStart(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.pem")
	tests := []struct {
		name string
		env  map[string]string
		want string // the variable the error names
	}{
		{"protocol grpc", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"},
		{"traces protocol grpc", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=grpc"},
		{"protocol grpc beside the flag", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "OTEL_EXPORTER_OTLP_PROTOCOL=grpc"},
		{"endpoint on the grpc port", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{"traces endpoint on the grpc port", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4317/v1/traces"}, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"},
		{"unknown protocol", map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/proto"}, "OTEL_EXPORTER_OTLP_PROTOCOL=http/proto"},
		{"json", map[string]string{"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, "OTEL_EXPORTER_OTLP_PROTOCOL=http/json"},
		{"timeout with a unit", map[string]string{"OTEL_EXPORTER_OTLP_TIMEOUT": "10s"}, "OTEL_EXPORTER_OTLP_TIMEOUT=10s"},
		{"zero timeout", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "0"}, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT=0"},
		{"unknown compression", map[string]string{"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"}, "OTEL_EXPORTER_OTLP_COMPRESSION=zstd"},
		{"header without a value", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "authorization"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		{"header name with a space", map[string]string{"OTEL_EXPORTER_OTLP_TRACES_HEADERS": "bad key=v"}, "OTEL_EXPORTER_OTLP_TRACES_HEADERS"},
		{"header value badly encoded", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "k=%zz"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		{"header value with a line break", map[string]string{"OTEL_EXPORTER_OTLP_HEADERS": "k=a%0D%0Ab"}, "OTEL_EXPORTER_OTLP_HEADERS"},
		{"missing certificate", map[string]string{"OTEL_EXPORTER_OTLP_CERTIFICATE": missing}, "OTEL_EXPORTER_OTLP_CERTIFICATE"},
		{"client certificate without its key", map[string]string{"OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE": missing}, "OTEL_EXPORTER_OTLP_CLIENT_CERTIFICATE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearOTLPEnv(t)
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			opts := TraceOptions{SampleRatio: 1}
			if !opts.Enabled() {
				opts.Endpoint = "http://127.0.0.1:4318"
			}
			_, err := NewTracer(t.Context(), opts)
			if err == nil {
				t.Fatal("accepted")
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q does not name %s", err, tt.want)
			}
		})
	}
}

// The traces' own protocol variable overrides the general one, as the OTel SDKs read them: a
// general grpc for other signals leaves traces on OTLP/HTTP.
func TestTracer_TracesProtocolOverridesTheGeneralOne(t *testing.T) {
	clearOTLPEnv(t)
	rc := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rc.URL)
	t.Setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "http/protobuf")
	traceOneRequest(t, TraceOptions{})
	if got := rc.received(); len(got) != 1 {
		t.Errorf("%d exports reached the OTLP/HTTP receiver, want 1", len(got))
	}
}
