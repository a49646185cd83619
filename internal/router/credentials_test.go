package router

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"sync"
	"testing"
)

// guardedWorker answers only requests that carry want as their Authorization (401 otherwise), as
// a worker behind an authenticating proxy does on every path, and remembers the paths refused.
type guardedWorker struct {
	srv     *httptest.Server
	want    string
	mu      sync.Mutex
	refused map[string]string // path → the Authorization it came with
}

func newGuardedWorker(t *testing.T, want string) *guardedWorker {
	g := &guardedWorker{want: want, refused: map[string]string{}}
	g.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		if got := r.Header.Get("Authorization"); got != g.want {
			g.mu.Lock()
			g.refused[r.URL.Path] = got
			g.mu.Unlock()
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/health":
		case "/v1/models":
			_ = json.NewEncoder(w).Encode(map[string]any{"object": "list", "data": []map[string]string{{"id": "test-model", "object": "model"}}})
		default:
			_, _ = io.WriteString(w, `{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
		}
	}))
	t.Cleanup(g.srv.Close)
	return g
}

func (g *guardedWorker) refusals() map[string]string {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := map[string]string{}
	for k, v := range g.refused {
		out[k] = v
	}
	return out
}

// TestEveryCallToAWorkerCarriesTheSameCredential: health probes, /v1/models and routed requests
// all carry the --api-key as a bearer token when it is set, else the URL's user:password@ as
// Basic credentials, so a worker that requires its credential on every path is healthy and
// serves.
func TestEveryCallToAWorkerCarriesTheSameCredential(t *testing.T) {
	for _, tc := range []struct {
		name, key, want string
	}{
		{"the key, over the URL's user", "k1", "Bearer k1"},
		{"the URL's user without a key", "", "Basic dTpw"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGuardedWorker(t, tc.want)
			u, _ := url.Parse(g.srv.URL)
			u.User = url.UserPassword("u", "p")
			cfg := testConfig()
			cfg.APIKey = tc.key
			tr := startRouter(t, cfg)
			if err := tr.AddWorker(context.Background(), u.String()); err != nil {
				t.Fatal(err)
			}
			resp := tr.post(t, "/v1/chat/completions", `{"model":"test-model","messages":[{"role":"user","content":"hi"}]}`)
			body := readAll(t, resp)
			if resp.StatusCode != http.StatusOK {
				t.Errorf("routed request: %d %s", resp.StatusCode, body)
			}
			if r := g.refusals(); len(r) != 0 {
				t.Errorf("the worker refused, by path, these Authorization values: %q; want %q on every call", r, tc.want)
			}
		})
	}
}
