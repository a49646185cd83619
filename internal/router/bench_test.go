package router

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/config"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// stubWorker answers /v1/models with model "m" and every other request, once its body is read,
// with the fixed JSON reply: a worker that costs the benchmarks next to nothing, whatever leg it
// stands for.
func stubWorker(reply string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			_, _ = io.WriteString(w, `{"object":"list","data":[{"id":"m"}]}`)
			return
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, reply)
	}
}

// stubChatWorker answers every chat with a fixed small chat completion.
var stubChatWorker = stubWorker(`{"id":"c","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}]}`)

// BenchmarkProxyChat measures one small chat request through the router to a loopback worker, over
// real HTTP on both legs (client → router → worker).
func BenchmarkProxyChat(b *testing.B) {
	worker := httptest.NewServer(stubChatWorker)
	defer worker.Close()
	cfg := testConfig()
	cfg.WorkerURLs = []string{worker.URL}
	benchProxyChat(b, cfg, nil)()
}

// benchProxyChat runs the loop of BenchmarkProxyChat through a router built from cfg, checking
// each answer's headers with check when it is not nil, and returns the function that stops the
// router and waits for it (flushing what it still holds).
func benchProxyChat(b *testing.B, cfg config.Config, check func(http.Header) error) (stop func()) {
	b.Helper()
	r, err := New(cfg, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		b.Fatal(err)
	}
	r.Start(b.Context())
	ln := testkit.Listen(b)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln, nil) }()
	front := "http://" + ln.Addr().String()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	body := `{"model":"m","messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello in one word."}]}`
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		resp, err := client.Post(front+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			b.Fatalf("status %d", resp.StatusCode)
		}
		if check != nil {
			if err := check(resp.Header); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.StopTimer()
	return func() {
		cancel()
		<-done
	}
}

// serveForBench serves r on a loopback port until the benchmark ends and returns its base URL.
func serveForBench(b *testing.B, r *Router) string {
	b.Helper()
	ln := testkit.Listen(b)
	ctx, cancel := context.WithCancel(context.Background())
	testkit.Go(b, cancel, func() error { return r.Serve(ctx, ln, nil) })
	return "http://" + ln.Addr().String()
}
