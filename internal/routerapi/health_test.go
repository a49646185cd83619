package routerapi

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
	"github.com/cacheroute/cacheroute/internal/workers"
)

// /health says why a worker is down, to the callers that may see worker URLs, and the admin API
// refuses a worker given as its OpenAI base URL.

// failProbes runs one health probe of every worker of ta's pool with the /health endpoint.
func failProbes(t *testing.T, ta *testAPI) {
	t.Helper()
	c := workers.NewChecker(ta.Pool, workers.HealthOptions{Endpoint: "/health", Timeout: 5 * time.Second,
		FailureThreshold: 1, SuccessThreshold: 1}, &http.Client{}, slog.New(slog.DiscardHandler))
	c.CheckAll(context.Background())
}

// healthWorkers decodes the worker list of a /health body; nil when it has none.
func healthWorkers(t *testing.T, body string) []WorkerInfo {
	t.Helper()
	var h struct {
		Workers []WorkerInfo `json:"workers"`
	}
	if err := json.Unmarshal([]byte(body), &h); err != nil {
		t.Fatalf("/health body %q: %v", body, err)
	}
	return h.Workers
}

func TestHealthDetailShowsEachWorkersLastProbeError(t *testing.T) {
	down := testkit.NamedServer(t, http.StatusNotFound, "down") // its /health answers 404
	ta := newTestAPI(t, Options{}, down.URL)
	failProbes(t, ta)

	status, _, body := ta.do(t, http.MethodGet, "/health", "")
	if status != http.StatusServiceUnavailable {
		t.Fatalf("/health %d, want 503 with the only worker down", status)
	}
	ws := healthWorkers(t, body)
	if len(ws) != 1 {
		t.Fatalf("/health from loopback lists %d workers: %s", len(ws), body)
	}
	w := ws[0]
	if !strings.Contains(w.LastProbeError, "GET /health answered 404 Not Found") || w.LastProbeErrorTime == nil ||
		w.ProbeFailures == nil || *w.ProbeFailures != 1 {
		t.Errorf("worker %+v, want the 404, its time and 1 consecutive failure", w)
	}
	// A worker that never failed a probe carries none of the fields.
	ta2 := newTestAPI(t, Options{}, testkit.NamedServer(t, http.StatusOK, "up").URL)
	_, _, body = ta2.do(t, http.MethodGet, "/health", "")
	if strings.Contains(body, "probe") {
		t.Errorf("/health of a never-failed worker mentions probes: %s", body)
	}
}

func TestHealthHidesProbeErrorsFromCallersThatMayNotSeeWorkers(t *testing.T) {
	down := testkit.NamedServer(t, http.StatusNotFound, "down")
	ta := newTestAPI(t, Options{AdminAPIKey: "adm1n-key"}, down.URL)
	failProbes(t, ta)

	_, _, body := ta.do(t, http.MethodGet, "/health", "")
	if strings.Contains(body, "probe") || strings.Contains(body, "404") || strings.Contains(body, down.URL) {
		t.Errorf("/health without the admin key shows the probe error or the worker: %s", body)
	}
	_, _, body = ta.do(t, http.MethodGet, "/health", "", "Authorization", "Bearer adm1n-key")
	if ws := healthWorkers(t, body); len(ws) != 1 || !strings.Contains(ws[0].LastProbeError, "404") {
		t.Errorf("/health with the admin key: %s, want the worker and its probe error", body)
	}
	// Nor does a remote caller see them when no admin key is set.
	ta = newTestAPI(t, Options{}, down.URL)
	failProbes(t, ta)
	if rec := ta.remote(http.MethodGet, "/health", "", "198.51.100.7:40000"); strings.Contains(rec.Body.String(), "probe") {
		t.Errorf("/health to a remote caller shows probe errors: %s", rec.Body.String())
	}
}

func TestAdminAPIRefusesAWorkerURLEndingInV1AndSaysWhatToGive(t *testing.T) {
	ta := newTestAPI(t, Options{Fleet: &probeRecorder{}}, testkit.NamedServer(t, http.StatusOK, "w").URL)
	for _, path := range []string{"/workers", "/add_worker?url=http://10.0.0.9:8000/v1/"} {
		body := ""
		if path == "/workers" {
			body = `{"url":"http://10.0.0.9:8000/v1"}`
		}
		status, _, body := ta.do(t, http.MethodPost, path, body)
		if status != http.StatusBadRequest || errorCode(t, body) != "invalid_worker_url" ||
			!strings.Contains(body, "ends in /v1") || !strings.Contains(body, `\"http://10.0.0.9:8000\"`) {
			t.Errorf("%d %s, want 400 invalid_worker_url naming the base URL to give", status, body)
		}
	}
	if len(ta.Pool.URLs()) != 1 {
		t.Errorf("the pool changed: %v", ta.Pool.URLs())
	}
}
