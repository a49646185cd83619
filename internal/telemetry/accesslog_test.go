package telemetry

import (
	"bufio"
	"bytes"
	"encoding/json"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// lockedBuffer is a writer the test reads while the log writes.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func TestAccessLogWritesOneJSONLinePerEntry(t *testing.T) {
	var out lockedBuffer
	l := NewAccessLog(&out, nil)
	prompt, cached := 120, 96
	l.Log(Entry{RequestID: "r1", Route: "/v1/chat/completions", Status: 200, StatusClass: "2xx", PromptTokens: &prompt, CachedTokens: &cached})
	l.Log(Entry{RequestID: "r2", Route: "/v1/messages", Status: 529, StatusClass: "5xx"})
	l.Close()
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	var got []map[string]any
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("line %q is not JSON: %v", sc.Text(), err)
		}
		got = append(got, m)
	}
	if len(got) != 2 || got[0]["request_id"] != "r1" || got[0]["cached_tokens"] != float64(96) || got[1]["status"] != float64(529) {
		t.Fatalf("lines %v", got)
	}
	if _, ok := got[1]["prompt_tokens"]; ok {
		t.Error("unknown token counts must be left out, not written as 0")
	}
}

// blockedWriter never returns until released, as a full disk or a stalled pipe would.
type blockedWriter struct{ release chan struct{} }

func (w blockedWriter) Write(p []byte) (int, error) { <-w.release; return len(p), nil }

func TestAccessLogDropsEntriesRatherThanBlockRequests(t *testing.T) {
	w := blockedWriter{release: make(chan struct{})}
	var dropped atomic.Int64
	l := NewAccessLog(w, func() { dropped.Add(1) })
	done := make(chan struct{})
	go func() {
		defer close(done)
		for i := range 2 * AccessLogQueue {
			l.Log(Entry{RequestID: strings.Repeat("x", i%7)})
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Log blocked behind a writer that does not return")
	}
	if dropped.Load() < AccessLogQueue/2 {
		t.Fatalf("dropped %d of %d entries with a stalled writer; the queue holds %d", dropped.Load(), 2*AccessLogQueue, AccessLogQueue)
	}
	close(w.release)
	l.Close()
}

func TestSessionHashHidesTheKey(t *testing.T) {
	h := SessionHash("session:alice-secret")
	if h == "" || strings.Contains(h, "alice") || h != SessionHash("session:alice-secret") || h == SessionHash("session:bob") {
		t.Fatalf("hash %q", h)
	}
	if SessionHash("") != "" {
		t.Fatal("no key must have no hash")
	}
}
