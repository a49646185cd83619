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

func TestAccessLogHasALinePerRequestWithItsWorkerDecisionAndUsage(t *testing.T) {
	w := testkit.NewServer(t, func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rw.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(rw, `{"id":"c1","choices":[],"usage":{"prompt_tokens":42,"prompt_tokens_details":{"cached_tokens":32}}}`)
	})
	var out testkit.SyncBuffer
	log := telemetry.NewAccessLog(&out, nil)
	t.Cleanup(log.Close)
	opts := testOptions()
	opts.AccessLog = log
	tp := newTestProxy(t, setup{urls: []string{w.URL}, opts: &opts})
	tp.post(t, chatPath, chatBody, "x-session-id", "alice-secret-session", HeaderRequestID, "req-1")
	status, _, _ := tp.post(t, chatPath, `{"model":`, HeaderRequestID, "req-2")
	if status != http.StatusBadRequest {
		t.Fatalf("malformed body: %d", status)
	}
	testkit.WaitWithin(t, 5*time.Second, "two access log lines", func() bool { return len(jsonLines(t, &out)) == 2 })
	lines := jsonLines(t, &out)
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
