package proxy

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/telemetry"
)

// syncBuffer is a writer the test reads while the access log writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// lines are the JSON lines written so far.
func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("access log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

func TestAccessLogHasALinePerRequestWithItsWorkerDecisionAndUsage(t *testing.T) {
	w := newWorker(t, func(rw http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		rw.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(rw, `{"id":"c1","choices":[],"usage":{"prompt_tokens":42,"prompt_tokens_details":{"cached_tokens":32}}}`)
	})
	var out syncBuffer
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
	eventually(t, 5*time.Second, "two access log lines", func() bool { return len(out.lines(t)) == 2 })
	lines := out.lines(t)
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
