package router

import (
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	coltrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"
)

// otlpReceiver is an in-process OTLP/HTTP collector: it accepts the exporter's POSTs to
// /v1/traces and keeps the spans it decodes.
type otlpReceiver struct {
	*httptest.Server
	posts atomic.Int64
	mu    sync.Mutex
	spans map[string][]string // span name → trace ids (hex)
	attrs []string            // every attribute value seen, as text
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	rc := &otlpReceiver{spans: map[string][]string{}}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		if err != nil || r.URL.Path != "/v1/traces" || r.Header.Get("Content-Type") != "application/x-protobuf" {
			http.Error(w, "unexpected export", http.StatusBadRequest)
			return
		}
		var req coltrace.ExportTraceServiceRequest
		if err := proto.Unmarshal(body, &req); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		rc.posts.Add(1)
		rc.mu.Lock()
		for _, rs := range req.ResourceSpans {
			for _, kv := range rs.GetResource().GetAttributes() {
				rc.attrs = append(rc.attrs, kv.Key+"="+kv.GetValue().GetStringValue())
			}
			for _, ss := range rs.ScopeSpans {
				for _, s := range ss.Spans {
					rc.spans[s.Name] = append(rc.spans[s.Name], hex.EncodeToString(s.TraceId))
					for _, kv := range s.Attributes {
						rc.attrs = append(rc.attrs, kv.GetValue().String())
					}
				}
			}
		}
		rc.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-protobuf")
		out, _ := proto.Marshal(&coltrace.ExportTraceServiceResponse{})
		_, _ = w.Write(out)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func TestTracing_SpansReachAnOTLPReceiverAndTheWorkerJoinsTheTrace(t *testing.T) {
	rc := newOTLPReceiver(t)
	var mu sync.Mutex
	var seen []string
	worker := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" {
			mu.Lock()
			seen = append(seen, r.Header.Get("traceparent"))
			mu.Unlock()
		}
		stubChatWorker(w, r)
	}))
	defer worker.Close()
	cfg := testConfig()
	cfg.OTLPTracesEndpoint = rc.URL // no path: /v1/traces is added
	tr := startRouter(t, cfg)
	if err := tr.AddWorker(t.Context(), worker.URL); err != nil {
		t.Fatal(err)
	}
	const session = "a-session-id-that-must-not-leave"
	resp := tr.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "x-session-id", session)
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
	// Stopping the router exports what is queued.
	tr.cancel()
	select {
	case err := <-tr.done:
		tr.done <- err // for the cleanup, which waits on it too
	case <-time.After(15 * time.Second):
		t.Fatal("router did not stop")
	}
	if rc.posts.Load() == 0 {
		t.Fatal("the receiver got no export")
	}
	rc.mu.Lock()
	defer rc.mu.Unlock()
	for _, name := range []string{"POST /v1/chat/completions", "route", "upstream"} {
		if len(rc.spans[name]) != 1 {
			t.Fatalf("spans received %v: want one %q", rc.spans, name)
		}
	}
	traceID := rc.spans["POST /v1/chat/completions"][0]
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 1 || !strings.HasPrefix(seen[0], "00-"+traceID+"-") {
		t.Errorf("worker got traceparent %v, want one in trace %s", seen, traceID)
	}
	joined := strings.Join(rc.attrs, "\n")
	if !strings.Contains(joined, "service.name=cacheroute") {
		t.Errorf("resource attributes lack service.name=cacheroute: %v", rc.attrs)
	}
	if strings.Contains(joined, session) {
		t.Error("an exported attribute carries the session id")
	}
}

// BenchmarkProxyChatTraced is BenchmarkProxyChat with every request traced (ratio 1.0) and the
// spans exported over OTLP/HTTP to an in-process receiver that reads and drops them.
func BenchmarkProxyChatTraced(b *testing.B) {
	var exported atomic.Int64
	receiver := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		exported.Add(n)
	}))
	defer receiver.Close()
	worker := httptest.NewServer(stubChatWorker)
	defer worker.Close()
	cfg := testConfig()
	cfg.WorkerURLs = []string{worker.URL}
	cfg.OTLPTracesEndpoint = receiver.URL
	cfg.TraceSampleRatio = 1
	benchProxyChat(b, cfg, nil)()
	if exported.Load() == 0 {
		b.Fatal("no span was exported")
	}
}
