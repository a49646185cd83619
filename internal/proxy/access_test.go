package proxy

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/telemetry"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

// jsonLines are the JSON lines written to out so far, failing the test on any other line.
func jsonLines(t *testing.T, out *testkit.SyncBuffer) []map[string]any {
	t.Helper()
	var lines []map[string]any
	for _, line := range out.Lines() {
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("access log line %q: %v", line, err)
		}
		lines = append(lines, m)
	}
	return lines
}

// loggedProxy is a test router over one worker whose access log goes to the buffer it returns.
func loggedProxy(t *testing.T, url string) (*testProxy, *testkit.SyncBuffer) {
	t.Helper()
	out := &testkit.SyncBuffer{}
	log := telemetry.NewAccessLog(out, nil)
	t.Cleanup(log.Close)
	opts := testOptions()
	opts.AccessLog = log
	return newTestProxy(t, setup{urls: []string{url}, opts: &opts}), out
}

func TestAccessLogHasALinePerRequestWithItsWorkerDecisionAndUsage(t *testing.T) {
	w := testkit.NewServer(t, func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rw.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(rw, `{"id":"c1","choices":[],"usage":{"prompt_tokens":42,"prompt_tokens_details":{"cached_tokens":32}}}`)
	})
	tp, out := loggedProxy(t, w.URL)
	tp.post(t, chatPath, chatBody, "x-session-id", "alice-secret-session", HeaderRequestID, "req-1")
	status, _, _ := tp.post(t, chatPath, `{"model":`, HeaderRequestID, "req-2")
	if status != http.StatusBadRequest {
		t.Fatalf("malformed body: %d", status)
	}
	testkit.WaitWithin(t, 5*time.Second, "two access log lines", func() bool { return len(jsonLines(t, out)) == 2 })
	lines := jsonLines(t, out)
	ok, bad := lines[0], lines[1]
	if ok["request_id"] != "req-1" || ok["route"] != chatPath || ok["status"] != float64(200) || ok["worker"] != w.URL ||
		ok["decision"] != "round_robin" || ok["attempts"] != float64(1) || ok["prompt_tokens"] != float64(42) || ok["cached_tokens"] != float64(32) {
		t.Errorf("served request's line: %v", ok)
	}
	if s, _ := ok["session"].(string); s == "" || strings.Contains(s, "alice") {
		t.Errorf("session %q: want a hash of the key, never the key", ok["session"])
	}
	if bad["request_id"] != "req-2" || bad["status"] != float64(400) || bad["attempts"] != float64(0) {
		t.Errorf("refused request's line: %v", bad)
	}
}

// TestAnExchangeEndsOnceWhetherAnsweredWholeStreamedOrByTheRouter sends one request of each ending: the worker's answer
// read whole, the worker's answer streamed after the handler returned, and the router's own
// answer. Each is counted and logged exactly once, with its own status.
func TestAnExchangeEndsOnceWhetherAnsweredWholeStreamedOrByTheRouter(t *testing.T) {
	w := testkit.NewServer(t, func(rw http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if strings.Contains(string(body), `"stream":true`) {
			rw.Header().Set("Content-Type", "text/event-stream")
			for i := range 3 {
				_, _ = io.WriteString(rw, "data: {\"i\":"+string(rune('0'+i))+"}\n\n")
				rw.(http.Flusher).Flush()
			}
			_, _ = io.WriteString(rw, "data: [DONE]\n\n")
			return
		}
		rw.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(rw, `{"id":"c1","choices":[]}`)
	})
	tp, out := loggedProxy(t, w.URL)

	requests := []struct{ id, body string }{
		{"whole", chatBody},
		{"streamed", `{"model":"m","stream":true,"messages":[{"role":"user","content":"hello"}]}`},
		{"router", `{"model":`},
	}
	for _, r := range requests {
		tp.post(t, chatPath, r.body, HeaderRequestID, r.id)
	}
	// One request more, on the same connection: its line comes after every end of the others.
	tp.post(t, chatPath, `{"model":`, HeaderRequestID, "last")
	testkit.WaitWithin(t, 5*time.Second, "the last request's line", func() bool {
		lines := jsonLines(t, out)
		return len(lines) > 0 && lines[len(lines)-1]["request_id"] == "last"
	})
	seen := map[string]int{}
	status := map[string]float64{}
	for _, l := range jsonLines(t, out) {
		id, _ := l["request_id"].(string)
		seen[id]++
		status[id], _ = l["status"].(float64)
	}
	want := map[string]float64{"whole": 200, "streamed": 200, "router": 400, "last": 400}
	for id, st := range want {
		if seen[id] != 1 || status[id] != st {
			t.Errorf("request %s: %d lines, status %v; want one line with %v", id, seen[id], status[id], st)
		}
	}
	if got2, got4 := tp.requests("2xx"), tp.requests("4xx"); got2 != 2 || got4 != 2 {
		t.Errorf("counted %v 2xx and %v 4xx requests, want 2 and 2", got2, got4)
	}
}
