package telemetry

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/pem"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"
)

// export is one POST an otlpReceiver decoded.
type export struct {
	path   string
	header http.Header
	req    *coltrace.ExportTraceServiceRequest
}

// otlpReceiver is an OTLP/HTTP collector on loopback that decodes each export with the
// collector's generated types, the oracle for what the router writes by hand. It answers the
// statuses in fail first, one per POST, then 200.
type otlpReceiver struct {
	*httptest.Server
	mu      sync.Mutex
	exports []export
	fail    []int
}

func newOTLPReceiver(t *testing.T, fail ...int) *otlpReceiver {
	rc := &otlpReceiver{fail: fail}
	rc.Server = httptest.NewUnstartedServer(http.HandlerFunc(rc.serve))
	rc.Start()
	t.Cleanup(rc.Close)
	return rc
}

func (rc *otlpReceiver) serve(w http.ResponseWriter, r *http.Request) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.fail) > 0 {
		status := rc.fail[0]
		rc.fail = rc.fail[1:]
		http.Error(w, "not now", status)
		return
	}
	var body io.Reader = r.Body
	if r.Header.Get("Content-Encoding") == "gzip" {
		z, err := gzip.NewReader(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		body = z
	}
	b, err := io.ReadAll(body)
	var req coltrace.ExportTraceServiceRequest
	if err == nil {
		err = proto.Unmarshal(b, &req)
	}
	if err != nil || r.Method != http.MethodPost || r.Header.Get("Content-Type") != "application/x-protobuf" {
		http.Error(w, "not an OTLP/HTTP protobuf export", http.StatusBadRequest)
		return
	}
	rc.exports = append(rc.exports, export{path: r.URL.Path, header: r.Header.Clone(), req: &req})
	out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
	w.Header().Set("Content-Type", "application/x-protobuf")
	_, _ = w.Write(out)
}

func (rc *otlpReceiver) received() []export {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return rc.exports
}

// traceOneRequest makes the spans of one routed request with a tracer exporting as o says, and
// returns its trace id once the tracer's shutdown exported them. (An export's error reaches the
// SDK's error handler, not the caller: upload gives it.)
func traceOneRequest(t *testing.T, o TraceOptions) (traceID string) {
	t.Helper()
	o.SampleRatio = 1
	tr, err := NewTracer(t.Context(), o)
	if err != nil || tr == nil {
		t.Fatalf("tracer %v, error %v", tr, err)
	}
	h := fakeHeaders{}
	rt := tr.Start(h, "POST", "/v1/chat/completions", "rid-1", time.Now())
	rt.Request("m", "session")
	rt.Attempt(1, "http://127.0.0.1:8000")
	rt.Inject(h)
	rt.Answered(200)
	rt.End(Outcome{Status: 200, StatusClass: "2xx", Attempts: 1, Worker: "http://127.0.0.1:8000"})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	if err := tr.Shutdown(ctx); err != nil { // exports the queued spans
		t.Fatal(err)
	}
	_, rest, _ := strings.Cut(h["traceparent"], "-")
	traceID, _, _ = strings.Cut(rest, "-")
	return traceID
}

// upload sends one span to endpoint as the settings of the environment say, and returns the
// export's error.
func upload(t *testing.T, endpoint string) error {
	t.Helper()
	s, err := readExportSettings(endpoint)
	if err != nil {
		t.Fatal(err)
	}
	span := &tracepb.Span{TraceId: bytes.Repeat([]byte{1}, 16), SpanId: bytes.Repeat([]byte{2}, 8), Name: "upstream"}
	c := newOTLPClient(s)
	defer c.Stop(t.Context())
	return c.UploadTraces(t.Context(), []*tracepb.ResourceSpans{{ScopeSpans: []*tracepb.ScopeSpans{{Spans: []*tracepb.Span{span}}}}})
}

// spanNames lists the spans of the exports, each with its trace id, and the service name.
func spanNames(exports []export) (names map[string]string, service string) {
	names = map[string]string{}
	for _, e := range exports {
		for _, rs := range e.req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				if kv.Key == "service.name" {
					service = kv.GetValue().GetStringValue()
				}
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					names[s.Name] = hex.EncodeToString(s.TraceId)
				}
			}
		}
	}
	return names, service
}

func TestOTLPClient_SpansReachAReceiverThatDecodesThemWithTheCollectorTypes(t *testing.T) {
	clearOTLPEnv(t)
	rc := newOTLPReceiver(t)
	traceID := traceOneRequest(t, TraceOptions{Endpoint: rc.URL}) // no path: /v1/traces
	got := rc.received()
	if len(got) != 1 || got[0].path != "/v1/traces" {
		t.Fatalf("exports %+v; want one to /v1/traces", got)
	}
	names, service := spanNames(got)
	for _, n := range []string{"POST /v1/chat/completions", "route", "upstream"} {
		if names[n] != traceID {
			t.Errorf("span %q: trace %q, want %q (spans %v)", n, names[n], traceID, names)
		}
	}
	if service != "cacheroute" {
		t.Errorf("service.name %q", service)
	}
}

// The variables name the endpoint as the OTel SDKs read them: the traces' own as it is, the
// general one with /v1/traces appended to its path.
func TestOTLPClient_EndpointFromTheEnvironment(t *testing.T) {
	rc := newOTLPReceiver(t)
	tests := []struct {
		name, variable, value, wantPath string
	}{
		{"general endpoint", "OTEL_EXPORTER_OTLP_ENDPOINT", rc.URL, "/v1/traces"},
		{"general endpoint with a path", "OTEL_EXPORTER_OTLP_ENDPOINT", rc.URL + "/otlp/", "/otlp/v1/traces"},
		{"traces endpoint as it is", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", rc.URL + "/custom/traces", "/custom/traces"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clearOTLPEnv(t)
			t.Setenv(tt.variable, tt.value)
			before := len(rc.received())
			traceOneRequest(t, TraceOptions{})
			got := rc.received()[before:]
			if len(got) != 1 || got[0].path != tt.wantPath {
				t.Errorf("exports %+v; want one to %s", got, tt.wantPath)
			}
		})
	}
}

func TestOTLPClient_HeadersAndGzipFromTheEnvironment(t *testing.T) {
	clearOTLPEnv(t)
	rc := newOTLPReceiver(t)
	t.Setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-tenant=general,x-other=kept")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_HEADERS", " Authorization = Bearer%20a+b%3D , x-tenant=traces")
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION", "gzip")
	traceOneRequest(t, TraceOptions{Endpoint: rc.URL})
	got := rc.received()
	if len(got) != 1 {
		t.Fatalf("%d exports", len(got))
	}
	h := got[0].header
	if h.Get("Authorization") != "Bearer a+b=" || h.Get("X-Tenant") != "traces" || h.Get("X-Other") != "" {
		t.Errorf("headers %v; want the traces' own variable, percent-decoded, and nothing of the general one", h)
	}
	if h.Get("Content-Encoding") != "gzip" {
		t.Errorf("Content-Encoding %q", h.Get("Content-Encoding"))
	}
	if names, _ := spanNames(got); len(names) != 3 {
		t.Errorf("spans %v", names)
	}
}

// A collector that is briefly unavailable gets the batch again; one that refuses it does not.
func TestOTLPClient_RetriesWhatMaySucceedLater(t *testing.T) {
	clearOTLPEnv(t)
	rc := newOTLPReceiver(t, http.StatusServiceUnavailable, http.StatusTooManyRequests)
	if err := upload(t, rc.URL); err != nil {
		t.Fatalf("export after a 503 and a 429: %v", err)
	}
	if got := rc.received(); len(got) != 1 {
		t.Errorf("%d exports decoded; want the batch once, on the third try", len(got))
	}

	refusing := newOTLPReceiver(t, http.StatusBadRequest, http.StatusBadRequest)
	err := upload(t, refusing.URL)
	if err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("export to a collector answering 400: %v; want the 400", err)
	}
	refusing.mu.Lock()
	defer refusing.mu.Unlock()
	if len(refusing.fail) != 1 {
		t.Errorf("a 400 was retried: %d of 2 refusals left", len(refusing.fail))
	}
}

// A collector is a peer: what is read of its answer is bounded, however much it sends.
func TestOTLPClient_ReadsABoundedPartOfTheCollectorsAnswer(t *testing.T) {
	clearOTLPEnv(t)
	const offered = 256 << 20
	var mu sync.Mutex
	written := 0
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusBadRequest)
		chunk := []byte(strings.Repeat("x", 32<<10))
		for n := 0; n < offered; n += len(chunk) {
			if _, err := w.Write(chunk); err != nil {
				return // the client stopped reading and closed the connection
			}
			mu.Lock()
			written += len(chunk)
			mu.Unlock()
		}
	}))
	defer srv.Close()
	err := upload(t, srv.URL)
	if err == nil || !strings.Contains(err.Error(), "400") {
		t.Fatalf("export: %v; want the 400", err)
	}
	if len(err.Error()) > 2048 {
		t.Errorf("the error quotes %d bytes of the answer", len(err.Error()))
	}
	srv.CloseClientConnections()
	srv.Close() // waits for the handler
	mu.Lock()
	defer mu.Unlock()
	if written >= offered/2 {
		t.Errorf("the collector wrote %d of %d bytes: the answer was read whole", written, offered)
	}
}

// The collector's certificate is verified against OTEL_EXPORTER_OTLP_CERTIFICATE, and the
// router presents the client certificate the variables name to a collector that asks for one.
func TestOTLPClient_TLSFromTheEnvironment(t *testing.T) {
	clearOTLPEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1000") // the refused handshakes are retried until then
	rc := &otlpReceiver{}
	rc.Server = httptest.NewUnstartedServer(http.HandlerFunc(rc.serve))
	rc.TLS = &tls.Config{ClientAuth: tls.RequireAnyClientCert}
	rc.StartTLS()
	defer rc.Close()
	// httptest's certificate, for 127.0.0.1, is the collector's, its CA, and the router's own.
	cert := rc.TLS.Certificates[0]
	keyDER, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600) != nil ||
		os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER}), 0o600) != nil {
		t.Fatal("writing the PEM files")
	}

	if err := upload(t, rc.URL); err == nil {
		t.Fatal("exported to a collector whose certificate nothing vouches for")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_CERTIFICATE", certFile)
	if err := upload(t, rc.URL); err == nil {
		t.Fatal("exported without the client certificate the collector requires")
	}
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_CLIENT_CERTIFICATE", certFile)
	t.Setenv("OTEL_EXPORTER_OTLP_TRACES_CLIENT_KEY", keyFile)
	if err := upload(t, rc.URL); err != nil {
		t.Fatal(err)
	}
	if len(rc.received()) != 1 {
		t.Errorf("%d exports", len(rc.received()))
	}
}

func TestOTLPClient_TimeoutFromTheEnvironment(t *testing.T) {
	clearOTLPEnv(t)
	t.Setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "2500")
	s, err := readExportSettings("http://127.0.0.1:4318")
	if err != nil || s.timeout != 2500*time.Millisecond {
		t.Errorf("timeout %v, error %v; want 2.5s", s.timeout, err)
	}
}
