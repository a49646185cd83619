package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

// servePlainOnLoopback serves h through servePlain on a loopback port until the test ends, and
// returns its address.
func servePlainOnLoopback(t *testing.T, h http.Handler) string {
	t.Helper()
	ln := testkit.Listen(t)
	srv := &fasthttp.Server{Handler: servePlain(h)}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Shutdown() })
	return ln.Addr().String()
}

// kept is what a plain handler kept of one request, to be compared once others have come.
type kept struct {
	method, path, query, host, header, body string
	ctx                                     context.Context
}

func TestPlainHandlersKeepNothingThatTheNextRequestRewrites(t *testing.T) {
	var mu sync.Mutex
	var all []kept
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		all = append(all, kept{r.Method, r.URL.Path, r.URL.Query().Get("v"), r.Host, r.Header.Get("X-V"), string(body), r.Context()})
		mu.Unlock()
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "kept")
	})
	addr := servePlainOnLoopback(t, h)

	client := &http.Client{Timeout: 10 * time.Second}
	want := make([]kept, 0, 300)
	for i := range 300 {
		v := fmt.Sprintf("%03d%s", i, strings.Repeat("v", i%41))
		method := []string{http.MethodGet, http.MethodPost, http.MethodDelete}[i%3]
		req, _ := http.NewRequest(method, "http://"+addr+"/p/"+v+"?v="+v, strings.NewReader("body-"+v))
		req.Host = "host-" + v
		req.Header.Set("X-V", "header-"+v)
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(resp.Body); string(b) != "kept" || resp.Header.Get("Content-Type") != "text/plain" {
			t.Fatalf("answer %q %q", b, resp.Header.Get("Content-Type"))
		}
		resp.Body.Close()
		want = append(want, kept{method, "/p/" + v, v, "host-" + v, "header-" + v, "body-" + v, nil})
	}
	mu.Lock()
	defer mu.Unlock()
	if len(all) != len(want) {
		t.Fatalf("%d requests kept, want %d", len(all), len(want))
	}
	for i, got := range all {
		w := want[i]
		if got.method != w.method || got.path != w.path || got.query != w.query || got.host != w.host || got.header != w.header || got.body != w.body {
			t.Fatalf("request %d, read after the others: %+v, want %+v", i, got, w)
		}
		if got.ctx.Err() == nil {
			t.Fatalf("request %d: its context is still live after its handler returned", i)
		}
	}
}

func TestPlainHandlersAnswersKeepStatusHeadersAndBody(t *testing.T) {
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("X-Two", "a")
		w.Header().Add("X-Two", "b")
		w.WriteHeader(http.StatusTeapot)
		_, _ = io.WriteString(w, `{"ok":true}`)
	})
	addr := servePlainOnLoopback(t, h)
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusTeapot || string(b) != `{"ok":true}` || strings.Join(resp.Header.Values("X-Two"), ",") != "a,b" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("%d %q %q %q", resp.StatusCode, b, resp.Header.Values("X-Two"), resp.Header.Get("Content-Type"))
	}
}
