package proxy

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/telemetry"
	"github.com/cacheroute/cacheroute/internal/testkit"
)

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
	var out testkit.SyncBuffer
	log := telemetry.NewAccessLog(&out, nil)
	t.Cleanup(log.Close)
	opts := testOptions()
	opts.AccessLog = log
	tp := newTestProxy(t, setup{urls: []string{w.URL}, opts: &opts})

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
		lines := jsonLines(t, &out)
		return len(lines) > 0 && lines[len(lines)-1]["request_id"] == "last"
	})
	seen := map[string]int{}
	status := map[string]float64{}
	for _, l := range jsonLines(t, &out) {
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
