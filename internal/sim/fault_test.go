package sim

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/cacheroute/cacheroute/internal/testkit"
)

func faultyFleet(t *testing.T, mode string, cfg Config) *Fleet {
	t.Helper()
	cfg.FailureRate = 1
	cfg.FailureMode = mode
	fleet, err := StartLocal(1, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fleet.Close)
	return fleet
}

const chatBody = `{"messages":[{"role":"user","content":"hello"}],"max_tokens":8,"ignore_eos":true`

func TestFault_500(t *testing.T) {
	fleet := faultyFleet(t, FailHTTP500, testConfig())
	resp := post(t, fleet.URLs()[0]+"/v1/chat/completions", chatBody+"}")
	var e errorBody
	json.NewDecoder(resp.Body).Decode(&e)
	if resp.StatusCode != 500 || e.Type != "InternalServerError" || e.Code != 500 || resp.Header.Get(HeaderWorker) == "" {
		t.Fatalf("status %d body %+v", resp.StatusCode, e)
	}
	if s := fleet.Workers()[0].Stats(); s.Failed != 1 || s.Requests != 0 {
		t.Fatalf("stats %+v", s)
	}
}

func TestFault_ResetClosesTheConnection(t *testing.T) {
	fleet := faultyFleet(t, FailReset, testConfig())
	resp, err := http.Post(fleet.URLs()[0]+"/v1/chat/completions", "application/json", strings.NewReader(chatBody+"}"))
	if err == nil {
		resp.Body.Close()
		t.Fatalf("got status %d, want a transport error", resp.StatusCode)
	}
}

func TestFault_StallStopsMidStream(t *testing.T) {
	fleet := faultyFleet(t, FailStall, testConfig())
	w := fleet.Workers()[0]
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", fleet.URLs()[0]+"/v1/chat/completions",
		strings.NewReader(chatBody+`,"stream":true}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	var events int
	for events < 5 && sc.Scan() { // role + the first half of 8 tokens
		if sc.Text() != "" {
			events++
		}
	}
	if events != 5 {
		t.Fatalf("read %d events before the stall, want 5", events)
	}
	testkit.WaitFor(t, "the stall", func() bool { return w.Stats().GenerationTokens == 0 && w.Stats().Running == 1 })
	cancel() // the client gives up: the stalled request must let go
	testkit.WaitFor(t, "release", func() bool { s := w.Stats(); return s.Running == 0 && s.PinnedBlocks == 0 && s.Failed == 1 })
}

func TestFault_StallEndsWhenTheWorkerCloses(t *testing.T) {
	w := newWorker(t, func() Config { c := testConfig(); c.FailureRate = 1; c.FailureMode = FailStall; return c }())
	done := make(chan int)
	go func() { done <- do(t, w, "POST", "/v1/chat/completions", chatBody+"}").Code }()
	testkit.WaitFor(t, "the stall", func() bool { return w.Stats().Running == 1 })
	w.Close()
	if code := <-done; code != 500 {
		t.Fatalf("stalled request ended with %d, want 500", code)
	}
}

func TestFault_SlowMultipliesLatency(t *testing.T) {
	cfg := testConfig()
	cfg.FailureRate = 1
	cfg.FailureMode = FailSlow
	w := newWorker(t, cfg)
	rs := collect(w)
	chat(t, w, []msg{{"user", "slow"}}, 3)
	r := rs.list()[0]
	want := slowFactor * (cfg.PrefillOverhead + time.Duration(r.PromptTokens)*cfg.PrefillTimePerToken)
	if r.PrefillTime != want || r.E2E != r.TTFT+2*slowFactor*cfg.InterTokenLatency {
		t.Fatalf("slow: prefill %v e2e %v, want prefill %v", r.PrefillTime, r.E2E, want)
	}
}

func TestFault_RateIsAFraction(t *testing.T) {
	cfg := testConfig()
	cfg.FailureRate = 0.3
	w := newWorker(t, cfg)
	failed := 0
	for range 200 {
		if do(t, w, "POST", "/v1/chat/completions", chatBody+"}").Code == 500 {
			failed++
		}
	}
	if failed < 30 || failed > 90 {
		t.Fatalf("%d of 200 failed at rate 0.3", failed)
	}
}
