package routerapi

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/upstream"
)

func TestLoraAdapterIsLoadedOnEveryWorkerAndTheirModelsRefreshed(t *testing.T) {
	var mu sync.Mutex
	var auth []string
	lora := func(status int) *testkit.Server {
		return testkit.NewServer(t, func(rw http.ResponseWriter, r *http.Request) {
			body, _ := io.ReadAll(r.Body)
			mu.Lock()
			auth = append(auth, r.Header.Get("Authorization"))
			mu.Unlock()
			if r.URL.Path != "/v1/load_lora_adapter" || !strings.Contains(string(body), `"lora_name":"sql"`) {
				rw.WriteHeader(http.StatusBadRequest)
				return
			}
			rw.WriteHeader(status)
			_, _ = io.WriteString(rw, "Success: LoRA adapter 'sql' added successfully.")
		})
	}
	a, b := lora(http.StatusOK), lora(http.StatusOK)
	fleet := &probeRecorder{}
	opts := Options{Fleet: fleet, AdminAPIKey: "admin"}
	opts.Upstream.APIKey = "worker-key"
	opts.Upstream.Timeouts = upstream.Timeouts{Dial: 2 * time.Second, Request: 20 * time.Second}
	ta := newTestAPI(t, opts, a.URL, b.URL)
	body := `{"lora_name":"sql","lora_path":"/adapters/sql"}`
	if status, _, _ := ta.do(t, http.MethodPost, "/v1/load_lora_adapter", body); status != http.StatusUnauthorized {
		t.Fatalf("without the admin key: %d, want 401", status)
	}
	status, _, answer := ta.do(t, http.MethodPost, "/v1/load_lora_adapter", body, "Authorization", "Bearer admin")
	var got struct {
		Results []loraResult `json:"results"`
	}
	if err := json.Unmarshal([]byte(answer), &got); err != nil || status != http.StatusOK || len(got.Results) != 2 {
		t.Fatalf("%d %s (%v), want 200 with both workers' results", status, answer, err)
	}
	for _, r := range got.Results {
		if r.Status != http.StatusOK || !strings.Contains(string(r.Answer), "added successfully") {
			t.Errorf("result %+v", r)
		}
	}
	if a.Hits.Load() != 1 || b.Hits.Load() != 1 {
		t.Fatalf("hits %d %d, want one each", a.Hits.Load(), b.Hits.Load())
	}
	mu.Lock()
	for _, h := range auth {
		if h != "Bearer worker-key" {
			t.Errorf("a worker got Authorization %q: the admin key must never leave the router", h)
		}
	}
	mu.Unlock()
	fleet.mu.Lock()
	defer fleet.mu.Unlock()
	if len(fleet.probed) != 2 {
		t.Fatalf("probed %v, want both workers refreshed at once", fleet.probed)
	}
}

func TestLoraAdapterFailingOnOneWorkerIsReportedAsSuch(t *testing.T) {
	ok := testkit.NamedServer(t, http.StatusOK, "ok")
	bad := testkit.NamedServer(t, http.StatusBadRequest, "bad")
	ta := newTestAPI(t, Options{}, ok.URL, bad.URL)
	status, _, answer := ta.do(t, http.MethodPost, "/v1/load_lora_adapter", `{"lora_name":"x","lora_path":"/x"}`)
	if status != http.StatusBadGateway || !strings.Contains(answer, `"status": 400`) {
		t.Fatalf("%d %s, want 502 listing the worker's 400", status, answer)
	}
	if status, _, _ := ta.do(t, http.MethodPost, "/v1/load_lora_adapter", `{"lora_path":"/x"}`); status != http.StatusBadRequest {
		t.Fatalf("no lora_name: %d, want 400", status)
	}
}
