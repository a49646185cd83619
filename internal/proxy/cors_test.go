package proxy

import (
	"net/http"
	"testing"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

func corsProxy(t *testing.T) *testProxy {
	w := testkit.NewServer(t, func(rw http.ResponseWriter, r *http.Request) {
		rw.Header().Set("Access-Control-Allow-Origin", "*") // as vLLM's own CORS middleware may
		rw.Header().Set("Content-Type", "application/json")
		_, _ = rw.Write([]byte(`{"object":"list","data":[]}`))
	})
	opts := testOptions()
	opts.CORSOrigins = []string{"https://app.example"}
	return newTestProxy(t, setup{urls: []string{w.URL}, opts: &opts})
}

func TestCORSPreflightFromAnAllowedOriginIsAnswered(t *testing.T) {
	tp := corsProxy(t)
	status, h, _ := tp.do(t, http.MethodOptions, chatPath, "Origin", "https://app.example",
		"Access-Control-Request-Method", "POST", "Access-Control-Request-Headers", "authorization, content-type")
	if status != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "https://app.example" ||
		h.Get("Access-Control-Allow-Headers") != "authorization, content-type" {
		t.Fatalf("%d %v", status, h)
	}
	status, h, _ = tp.do(t, http.MethodOptions, chatPath, "Origin", "https://evil.example", "Access-Control-Request-Method", "POST")
	if status != http.StatusNoContent || h.Get("Access-Control-Allow-Origin") != "" {
		t.Fatalf("other origin: %d %v, want no Access-Control-Allow-Origin", status, h)
	}
}

func TestCORSAnswersNameTheAllowedOriginOnlyOnce(t *testing.T) {
	tp := corsProxy(t)
	_, h, _ := tp.post(t, chatPath, chatBody, "Origin", "https://app.example")
	if got := h.Values("Access-Control-Allow-Origin"); len(got) != 1 || got[0] != "https://app.example" {
		t.Fatalf("Access-Control-Allow-Origin %q, want the origin once (the worker's * replaced)", got)
	}
	if h.Get("Access-Control-Expose-Headers") == "" {
		t.Fatal("the router's headers are not exposed to the page")
	}
	_, h, _ = tp.post(t, chatPath, chatBody, "Origin", "https://evil.example")
	if got := h.Values("Access-Control-Allow-Origin"); len(got) != 0 {
		t.Fatalf("other origin got Access-Control-Allow-Origin %q", got)
	}
	_, h, _ = tp.do(t, http.MethodGet, "/v1/models", "Origin", "https://app.example")
	if h.Get("Access-Control-Allow-Origin") != "https://app.example" {
		t.Fatal("a non-routed endpoint has no CORS headers")
	}
}
