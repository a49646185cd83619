package proxy

import (
	"net/http"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/cacheroute/cacheroute/internal/clientkeys"
)

// Client API keys: the routed endpoints and /v1/models closed to callers without one.

func keySet(t *testing.T, file string) *clientkeys.Set {
	t.Helper()
	set, err := clientkeys.Parse("keys", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// keyedProxy is a test router that takes alice's and bob's client keys, and holds a key of its
// own for its one worker, which records the credentials each request brought it.
func keyedProxy(t *testing.T, forward bool) (*testProxy, *recordingWorker) {
	w := newRecordingWorker(t, http.StatusOK, `{"object":"list","data":[]}`)
	opts := testOptions()
	opts.ClientKeys = keySet(t, "sk-alice tenant=alice\nsk-bob tenant=bob priority=batch\n")
	opts.ForwardClientAuth = forward
	opts.Upstream.APIKey = "worker-key"
	return newTestProxy(t, setup{urls: []string{w.URL}, opts: &opts}), w
}

func TestRequestWithoutAValidClientKeyIsRefusedInItsRoutesShape(t *testing.T) {
	tp, w := keyedProxy(t, false)
	for _, auth := range [][]string{nil, {"Authorization", "Bearer sk-mallory"}, {"x-api-key", "sk-mallory"}, {"Authorization", "Basic sk-alice"}} {
		status, _, body := tp.post(t, chatPath, chatBody, auth...)
		if status != http.StatusUnauthorized || errorCode(t, body) != "invalid_api_key" {
			t.Errorf("chat with %v: %d %s, want 401 invalid_api_key", auth, status, body)
		}
		status, _, body = tp.post(t, "/v1/messages", `{"model":"m","max_tokens":1,"messages":[]}`, auth...)
		if status != http.StatusUnauthorized || anthropicErrorType(t, body) != "authentication_error" {
			t.Errorf("messages with %v: %d %s, want 401 authentication_error", auth, status, body)
		}
	}
	if status, _, _ := tp.do(t, http.MethodGet, "/v1/models"); status != http.StatusUnauthorized {
		t.Errorf("/v1/models without a key: %d, want 401", status)
	}
	if n := w.Hits.Load(); n != 0 {
		t.Fatalf("the worker got %d requests from callers without a valid key", n)
	}
}

func TestClientKeyIsReplacedByTheWorkerKeyUpstream(t *testing.T) {
	tp, w := keyedProxy(t, false)
	if status, _, body := tp.post(t, chatPath, chatBody, "Authorization", "bearer sk-alice"); status != http.StatusOK {
		t.Fatalf("valid key: %d %s", status, body)
	}
	if status, _, body := tp.post(t, "/v1/messages", `{"model":"m","max_tokens":1,"messages":[]}`, "x-api-key", "sk-bob"); status != http.StatusOK {
		t.Fatalf("valid x-api-key: %d %s", status, body)
	}
	if status, _, _ := tp.do(t, http.MethodGet, "/v1/models", "Authorization", "Bearer sk-bob"); status != http.StatusOK {
		t.Fatalf("/v1/models with a key: %d", status)
	}
	if a, b := testutil.ToFloat64(tp.Metrics.TenantRequests.WithLabelValues("alice")), testutil.ToFloat64(tp.Metrics.TenantRequests.WithLabelValues("bob")); a != 1 || b != 1 {
		t.Errorf("tenant_requests_total alice %v bob %v, want 1 and 1", a, b)
	}
	auth, xk := w.headerValues("Authorization"), w.headerValues("X-Api-Key")
	for i := range auth {
		if auth[i] != "Bearer worker-key" || xk[i] != "" {
			t.Errorf("request %d reached the worker with Authorization %q, x-api-key %q: the client's key must not leave the router", i, auth[i], xk[i])
		}
	}
}

func TestForwardClientAuthSendsTheClientsKeyUpstream(t *testing.T) {
	tp, w := keyedProxy(t, true)
	tp.post(t, chatPath, chatBody, "Authorization", "Bearer sk-alice")
	if auth := w.headerValues("Authorization"); len(auth) != 1 || auth[0] != "Bearer sk-alice" {
		t.Fatalf("worker got %q, want the client's key", auth)
	}
}
