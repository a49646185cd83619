package router

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/cacheroute/cacheroute/internal/policy/cacheaware"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// A value the router keeps from a request must be its own copy: the listener reuses a request's
// buffers for the next request, so a kept value that shares their memory is rewritten by whoever
// comes next. Each test here stores one kind of value through the real listener, sends a few
// hundred requests of other shapes and lengths (refused ones among them), and then checks the
// stored value byte for byte. Built with -tags cacheroute_poison, the listener also overwrites
// every request's buffers once its handler returns, so a value that aliases them is caught on the
// first request that follows rather than by the chance of a later one landing at its offset.

// noise sends n requests of assorted shapes, methods and lengths, many of them refused (404, 400,
// 403 for a proxied caller, 405), each carrying lookalike of bait: a worker URL, an id, a key. It
// checks nothing of their answers; they exist to reuse the listener's buffers.
func noise(t *testing.T, tr *testRouter, n int, bait string) {
	t.Helper()
	for i := range n {
		pad := strings.Repeat("x", i%37)
		var req *http.Request
		switch i % 8 {
		case 0:
			req, _ = http.NewRequest(http.MethodGet, tr.url+"/health?"+pad+bait, nil)
			req.Header.Set("X-Forwarded-For", "203.0.113.9")
		case 1:
			req, _ = http.NewRequest(http.MethodGet, tr.url+"/no/such/path/"+pad+"?u="+bait, nil)
		case 2:
			req, _ = http.NewRequest(http.MethodPost, tr.url+"/add_worker?url="+pad+"not-a-url", nil)
		case 3:
			req, _ = http.NewRequest(http.MethodPost, tr.url+"/v1/chat/completions", strings.NewReader(`{"messages":[{"role":"user","content":"`+pad+bait+`"}]}`))
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("x-session-id", pad+bait)
			req.Header.Set("x-request-id", "noise-"+pad)
		case 4:
			req, _ = http.NewRequest(http.MethodPost, tr.url+"/v1/chat/completions", strings.NewReader(pad+"{not json"+bait))
		case 5:
			req, _ = http.NewRequest(http.MethodPut, tr.url+"/workers?url="+pad+bait, nil)
		case 6:
			req, _ = http.NewRequest(http.MethodGet, tr.url+"/workers/"+pad+"x", nil)
			req.Header.Set("Authorization", "Bearer "+pad+bait)
		case 7:
			req, _ = http.NewRequest(http.MethodGet, tr.url+"/v1/responses/"+pad+bait, nil)
		}
		req.Header.Set("X-Noise", pad+bait)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
	}
}

func TestWorkerAddedByQueryKeepsItsURLWhileOtherRequestsReuseTheBuffers(t *testing.T) {
	keys := clientKeysFile(t, "sk-client tenant=a\n")
	for _, keyed := range []bool{false, true} {
		for _, path := range []string{"/add_worker?url=", "/workers?url="} {
			t.Run(fmt.Sprintf("%s keys=%v", path, keyed), func(t *testing.T) {
				first, added, attacker := newFakeWorker(t), newFakeWorker(t), newFakeWorker(t)
				cfg := testConfig()
				var admin, client []string
				if keyed { // the worker key, an admin key and client keys: none of them closes the hole
					cfg.APIKey, cfg.AdminAPIKey, cfg.ClientAPIKeysFile = "K", "adm1n", keys
					admin, client = []string{"Authorization", "Bearer adm1n"}, []string{"Authorization", "Bearer sk-client"}
				}
				tr := startRouter(t, cfg, first)
				if status, body := adminCall(t, tr, http.MethodPost, path+added.URL(), "", admin...); status != http.StatusOK {
					t.Fatalf("adding %s: %d %s", added.URL(), status, body)
				}
				noise(t, tr, 400, attacker.URL())

				want := []string{first.URL(), added.URL()}
				if got := tr.Pool().URLs(); !slices.Equal(got, want) {
					t.Fatalf("the pool's URLs are %q after other requests, want %q", got, want)
				}
				for range 20 {
					readAll(t, tr.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"confidential"}]}`, client...))
				}
				if n := attacker.hits.Load(); n != 0 {
					t.Fatalf("a URL sent only in other requests' query strings received %d routed requests", n)
				}
				if added.hits.Load() == 0 {
					t.Fatal("the added worker received no routed request")
				}
				if status, body := adminCall(t, tr, http.MethodPost, "/remove_worker?url="+added.URL(), "", admin...); status != http.StatusOK {
					t.Fatalf("removing the added worker: %d %s", status, body)
				}
			})
		}
	}
}

func TestSessionMapKeepsItsKeysWhileOtherRequestsReuseTheBuffers(t *testing.T) {
	ws := []*fakeWorker{newFakeWorker(t), newFakeWorker(t), newFakeWorker(t), newFakeWorker(t)}
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	tr := startRouter(t, cfg, ws...)
	sessions := map[string]string{} // session id → the worker that took its first turn
	for i := range 8 {
		id := fmt.Sprintf("sess-%02d-%s", i, strings.Repeat("k", 40+i))
		resp := tr.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"turn one of `+id+`"}]}`, "x-session-id", id)
		readAll(t, resp)
		sessions[id] = resp.Header.Get("x-vllm-router-worker")
	}
	noise(t, tr, 400, "sess-00-kkkk")
	for id, worker := range sessions {
		resp := tr.post(t, "/v1/chat/completions", `{"messages":[{"role":"user","content":"turn two of `+id+`"}]}`, "x-session-id", id)
		readAll(t, resp)
		if got := resp.Header.Get("x-vllm-router-decision"); got != cacheaware.LabelSessionMatch {
			t.Errorf("session %s after other requests: decision %q, want %q", id, got, cacheaware.LabelSessionMatch)
		}
		if got := resp.Header.Get("x-vllm-router-worker"); got != worker {
			t.Errorf("session %s moved from %s to %s", id, worker, got)
		}
	}
}

func TestLearnedResponseIDsKeepTheirHolderWhileOtherRequestsReuseTheBuffers(t *testing.T) {
	ws := []*fakeWorker{newFakeWorker(t), newFakeWorker(t), newFakeWorker(t)}
	for i, w := range ws {
		w.setHandler(func(rw http.ResponseWriter, r *http.Request) {
			rw.Header().Set("Content-Type", "application/json")
			if r.Method == http.MethodGet {
				_, _ = fmt.Fprintf(rw, `{"id":%q,"object":"response","status":"completed"}`, strings.TrimPrefix(r.URL.Path, "/v1/responses/"))
				return
			}
			var body struct {
				Input string `json:"input"`
			}
			_ = json.NewDecoder(r.Body).Decode(&body)
			_, _ = fmt.Fprintf(rw, `{"id":"resp_%d_%s","object":"response","status":"completed","output":[]}`, i, body.Input)
		})
	}
	cfg := testConfig()
	cfg.Policy = "cache_aware"
	tr := startRouter(t, cfg, ws...)
	stored := map[string]string{} // response id → the worker that stored it
	for i := range 6 {
		resp := tr.post(t, "/v1/responses", fmt.Sprintf(`{"input":"q%d%s"}`, i, strings.Repeat("z", 30+i)))
		body := readAll(t, resp)
		var answer struct {
			ID string `json:"id"`
		}
		if err := json.Unmarshal([]byte(body), &answer); err != nil || answer.ID == "" {
			t.Fatalf("POST /v1/responses: %d %s", resp.StatusCode, body)
		}
		stored[answer.ID] = resp.Header.Get("x-vllm-router-worker")
	}
	noise(t, tr, 400, "resp_0_q0zzzz")
	for id, worker := range stored {
		resp, err := http.Get(tr.url + "/v1/responses/" + id)
		if err != nil {
			t.Fatal(err)
		}
		readAll(t, resp)
		if got := resp.Header.Get("x-vllm-router-decision"); got != "response_id_holder" {
			t.Errorf("GET %s after other requests: decision %q, want response_id_holder (the id was forgotten or rewritten)", id, got)
		}
		if got := resp.Header.Get("x-vllm-router-worker"); got != worker {
			t.Errorf("GET %s went to %s, want its holder %s", id, got, worker)
		}
	}
}

func TestAccessLogEntriesKeepTheirRequestsValuesWhileOtherRequestsReuseTheBuffers(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	cfg := testConfig()
	cfg.AccessLog = path
	cfg.Policy = "cache_aware"
	tr := startRouter(t, cfg, newFakeWorker(t), newFakeWorker(t))
	want := map[string]string{} // request id → model
	for i := range 200 {
		rid := fmt.Sprintf("rid-%03d-%s", i, strings.Repeat("r", i%50))
		model := "test-model"
		resp := tr.post(t, "/v1/chat/completions", `{"model":"`+model+`","messages":[{"role":"user","content":"`+strings.Repeat("m", i)+`"}]}`, "x-request-id", rid)
		readAll(t, resp)
		want[rid] = model
		if i%4 == 0 {
			noise(t, tr, 3, rid)
		}
	}
	seen := map[string]bool{}
	testkit.WaitFor(t, "an access log line for every request", func() bool {
		f, err := os.Open(path)
		if err != nil {
			return false
		}
		defer f.Close()
		clear(seen)
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var e struct {
				RequestID string `json:"request_id"`
				Route     string `json:"route"`
				Method    string `json:"method"`
				Model     string `json:"model"`
			}
			if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
				t.Fatalf("access log line %q: %v", sc.Text(), err)
			}
			if model, ok := want[e.RequestID]; ok {
				if e.Model != model || e.Route != "/v1/chat/completions" || e.Method != http.MethodPost {
					t.Fatalf("entry of %s reads model %q route %q method %q", e.RequestID, e.Model, e.Route, e.Method)
				}
				seen[e.RequestID] = true
			}
		}
		return len(seen) == len(want)
	})
}
