package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// sseServer answers chat requests with a short stream whose reply names the server, with usage,
// and records the bodies and session headers it saw.
type sseServer struct {
	name string
	srv  *httptest.Server

	mu       sync.Mutex
	bodies   []chatRequest
	sessions []string
}

func newSSEServer(t *testing.T, name string) *sseServer {
	s := &sseServer{name: name}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req chatRequest
		b, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(b, &req); err != nil {
			http.Error(w, err.Error(), 400)
			return
		}
		s.mu.Lock()
		s.bodies = append(s.bodies, req)
		s.sessions = append(s.sessions, r.Header.Get(headerSessionID))
		s.mu.Unlock()
		w.Header().Set("Content-Type", "text/event-stream")
		w.Header().Set(headerRouterWorker, name)
		w.Header().Set(headerRouterDecision, "test")
		io.WriteString(w, `data: {"choices":[{"delta":{"role":"assistant","content":""}}]}`+"\n\n")
		fmt.Fprintf(w, "data: {\"choices\":[{\"delta\":{\"content\":\"from \"}}]}\n\ndata: {\"choices\":[{\"delta\":{\"content\":%q}}]}\n\n", name)
		fmt.Fprintf(w, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":%d,\"completion_tokens\":2,\"prompt_tokens_details\":{\"cached_tokens\":%d}}}\n\n", 100, 40)
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func TestMultiURLTargetSpreadsRequestsRoundRobin(t *testing.T) {
	a, b := newSSEServer(t, "A"), newSSEServer(t, "B")
	w := Workload{Name: "t", Sessions: []Session{{ID: "s", Turns: []Turn{
		{Append: []Message{{"user", "one"}}, MaxTokens: 2},
		{Append: []Message{{"user", "two"}}, MaxTokens: 2},
		{Append: []Message{{"user", "three"}}, MaxTokens: 2},
		{Append: []Message{{"user", "four"}}, MaxTokens: 2},
		{Append: []Message{{"user", "five"}}, MaxTokens: 2},
	}}}}
	spec, err := ParseTarget("pair=" + a.srv.URL + "," + b.srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	tgt := &Target{Name: spec.Name, URLs: spec.URLs, SessionMode: SessionHeader}
	res := run(t.Context(), &w, tgt, RunOptions{Model: "m", Concurrency: 1, Timeout: 10 * time.Second})
	if len(res.records) != 5 {
		t.Fatalf("%d records", len(res.records))
	}
	for i, rec := range res.records {
		want := []string{"A", "B"}[i%2]
		if rec.Err != "" || rec.Worker != want {
			t.Fatalf("request %d: worker %q err %q, want %s", i, rec.Worker, rec.Err, want)
		}
	}
	if len(a.bodies) != 3 || len(b.bodies) != 2 {
		t.Fatalf("A got %d, B got %d requests", len(a.bodies), len(b.bodies))
	}
	// The session crosses replicas: B's first request (turn 2) carries A's reply to turn 1.
	got := b.bodies[0].Messages
	if len(got) != 3 || got[1] != (Message{"assistant", "from A"}) || got[2].Content != "two" {
		t.Fatalf("turn 2 messages %+v", got)
	}
	if a.sessions[0] != "s@pair" || b.sessions[0] != "s@pair" || !b.bodies[0].Stream {
		t.Fatalf("session headers %q %q", a.sessions[0], b.sessions[0])
	}
	rep := summarize(tgt, res, 1)
	if rep.HitRate != 0.4 || rep.WorkerShare["A"] != 0.6 || rep.Decisions["test"] != 5 {
		t.Fatalf("report %+v", rep)
	}
}

func TestSessionModes(t *testing.T) {
	s := newSSEServer(t, "A")
	w := Workload{Sessions: []Session{{ID: "x", Turns: []Turn{{Append: []Message{{"user", "hi"}}, MaxTokens: 1}}}}}
	for _, mode := range SessionModes {
		run(t.Context(), &w, &Target{Name: mode, URLs: []string{s.srv.URL}, SessionMode: mode}, RunOptions{Model: "m", Concurrency: 1})
	}
	body := s.bodies
	if s.sessions[0] != "x@header" || body[0].SessionParams != nil {
		t.Fatal("header mode")
	}
	if s.sessions[1] != "" || body[1].SessionParams == nil || body[1].SessionParams.SessionID != "x@body" {
		t.Fatal("body mode")
	}
	if s.sessions[2] != "" || body[2].SessionParams != nil {
		t.Fatal("none mode")
	}
}

func TestFailedTurnEndsItsSession(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, `{"error":"down"}`, http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	w := Workload{Sessions: []Session{{ID: "x", Turns: make([]Turn, 3)}}}
	res := run(t.Context(), &w, &Target{Name: "t", URLs: []string{srv.URL}}, RunOptions{Model: "m", Concurrency: 1})
	if len(res.records) != 1 || res.skipped != 2 || !strings.HasPrefix(res.records[0].Err, "HTTP 503") {
		t.Fatalf("records %+v skipped %d", res.records, res.skipped)
	}
}

func TestParsePoliciesAndTargets(t *testing.T) {
	ps, err := ParsePolicies([]string{"round_robin, cache_aware:none", "cache_aware"}, SessionBody)
	if err != nil {
		t.Fatal(err)
	}
	if len(ps) != 3 || ps[0].SessionMode != SessionBody || ps[1] != (PolicySpec{"cache_aware:none", "cache_aware", SessionNone}) {
		t.Fatalf("%+v", ps)
	}
	for _, bad := range []string{"nope", "cache_aware:sometimes", "round_robin,round_robin"} {
		if _, err := ParsePolicies([]string{bad}, SessionHeader); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	for _, bad := range []string{"=http://a", "x", "x=ftp://a", "x="} {
		if _, err := ParseTarget(bad); err == nil {
			t.Errorf("target %q accepted", bad)
		}
	}
}
