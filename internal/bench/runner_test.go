package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
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
	if len(ps) != 3 || ps[0].SessionMode != SessionBody || ps[1].Name != "cache_aware:none" || ps[1].Policy != "cache_aware" || ps[1].SessionMode != SessionNone {
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

// responsesServer is a worker that speaks the Responses API as the bench needs it: it stores
// the responses it makes and answers 404, in OpenAI's error shape, to a previous_response_id it
// did not store.
type responsesServer struct {
	name string
	srv  *httptest.Server

	mu     sync.Mutex
	n      int
	stored map[string]bool
	bodies []seenResponses
}

// seenResponses is a Responses body as a test server reads it.
type seenResponses struct {
	responsesRequest
	Input []struct {
		Type, Role, Content string
	} `json:"input"`
}

func newResponsesServer(t *testing.T, name string) *responsesServer {
	s := &responsesServer{name: name, stored: map[string]bool{}}
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req seenResponses
		if r.URL.Path != "/v1/responses" || json.NewDecoder(r.Body).Decode(&req) != nil {
			http.Error(w, "bad request", 400)
			return
		}
		s.mu.Lock()
		s.bodies = append(s.bodies, req)
		known := req.PreviousResponseID == "" || s.stored[req.PreviousResponseID]
		s.n++
		id := fmt.Sprintf("resp_%s_%d", name, s.n)
		if req.Store {
			s.stored[id] = true
		}
		s.mu.Unlock()
		w.Header().Set(headerRouterWorker, name)
		if !known {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprintf(w, `{"error":{"message":"Response with id '%s' not found.","type":"invalid_request_error","param":"previous_response_id","code":"previous_response_not_found"}}`, req.PreviousResponseID)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"id\":%q,\"usage\":null}}\n\n", id)
		fmt.Fprintf(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":%q}\n\n", "from "+name)
		fmt.Fprintf(w, "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"id\":%q,\"usage\":{\"input_tokens\":100,\"input_tokens_details\":{\"cached_tokens\":50},\"output_tokens\":2}}}\n\n", id)
	}))
	t.Cleanup(s.srv.Close)
	return s
}

func threeTurns() Workload {
	return Workload{Name: "t", Sessions: []Session{{ID: "s", Turns: []Turn{
		{Append: []Message{{"system", "be brief"}, {"user", "one"}}, MaxTokens: 2},
		{Append: []Message{{"user", "two"}}, MaxTokens: 2},
		{Append: []Message{{"user", "three"}}, MaxTokens: 2},
	}}}}
}

func TestResponsesChainNamesThePreviousResponseAndSendsOnlyTheNewInput(t *testing.T) {
	a := newResponsesServer(t, "A")
	w := threeTurns()
	tgt := &Target{Name: "one", URLs: []string{a.srv.URL}, SessionMode: SessionHeader}
	res := run(t.Context(), &w, tgt, RunOptions{API: APIResponsesChain, Model: "m", Concurrency: 1, Timeout: 10 * time.Second})
	rep := summarize(tgt, res, 1)
	if rep.Requests != 3 || rep.Errors != 0 || rep.ResponseNotFound != 0 || rep.SameWorker == nil || *rep.SameWorker != 1 {
		t.Fatalf("report %+v (errors %v)", rep, rep.ErrorSamples)
	}
	for i, want := range []string{"", "resp_A_1", "resp_A_2"} {
		b := a.bodies[i]
		if b.PreviousResponseID != want || !b.Store || b.Instructions != "be brief" || len(b.Input) != 1 || b.PromptCacheKey != "s@one" {
			t.Fatalf("turn %d body %+v", i+1, b)
		}
	}
	if a.bodies[2].Input[0].Content != "three" {
		t.Fatalf("turn 3 input %+v", a.bodies[2].Input)
	}
	if rep.HitRate != 0.5 {
		t.Fatalf("hit rate %v", rep.HitRate)
	}
}

// A turn that reaches a worker other than the one holding its previous response is answered
// 404: it is counted as "response not found", it ends its session, and the turn counts as a
// later turn on another worker.
func TestResponsesChainCountsResponseNotFoundOnAnotherWorker(t *testing.T) {
	a, b := newResponsesServer(t, "A"), newResponsesServer(t, "B")
	w := threeTurns()
	tgt := &Target{Name: "pair", URLs: []string{a.srv.URL, b.srv.URL}, SessionMode: SessionHeader}
	res := run(t.Context(), &w, tgt, RunOptions{API: APIResponsesChain, Model: "m", Concurrency: 1, Timeout: 10 * time.Second})
	rep := summarize(tgt, res, 1)
	if rep.Requests != 1 || rep.Errors != 1 || rep.ResponseNotFound != 1 || rep.Skipped != 1 {
		t.Fatalf("report %+v", rep)
	}
	if rep.SameWorker == nil || *rep.SameWorker != 0 {
		t.Fatalf("same worker %v", rep.SameWorker)
	}
	if !strings.Contains(rep.ErrorSamples[0], "HTTP 404") || !strings.Contains(rep.ErrorSamples[0], "resp_A_1") {
		t.Fatalf("error %v", rep.ErrorSamples)
	}

	// Full resends do not chain: the same pair serves every turn, and a 404 on a request that
	// named no previous response is not "response not found".
	w = threeTurns()
	res = run(t.Context(), &w, tgt, RunOptions{API: APIResponses, Model: "m", Concurrency: 1, Timeout: 10 * time.Second})
	rep = summarize(tgt, res, 1)
	if rep.Requests != 3 || rep.Errors != 0 || b.bodies[len(b.bodies)-1].PreviousResponseID != "" || b.bodies[len(b.bodies)-1].Store {
		t.Fatalf("full resend over the pair: %+v", rep)
	}
	if got := a.bodies[len(a.bodies)-1].Input; len(got) != 5 || got[1].Role != "assistant" || got[1].Content != "from A" || got[3].Content != "from B" {
		t.Fatalf("turn 3 input %+v", got)
	}
	if rep := summarize(tgt, runResult{records: []Record{{Err: "HTTP 404: no route", Status: 404}}}, 1); rep.ResponseNotFound != 0 {
		t.Fatal("a 404 without previous_response_id counted as response not found")
	}
}

// threeTurnsAnswered runs the three-turn workload on api, one session at a time, against a
// server that answers every request with answer.
func threeTurnsAnswered(t *testing.T, api, answer string) runResult {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, answer) }))
	defer srv.Close()
	w := threeTurns()
	return run(t.Context(), &w, &Target{Name: "t", URLs: []string{srv.URL}}, RunOptions{API: api, Model: "m", Concurrency: 1})
}

func TestResponsesChainEndsTheSessionWithoutAResponseID(t *testing.T) {
	res := threeTurnsAnswered(t, APIResponsesChain, "data: {\"type\":\"response.output_text.delta\",\"delta\":\"x\"}\n\n"+
		"data: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n")
	if len(res.records) != 1 || res.records[0].Err != "no response id in the stream" || res.skipped != 2 {
		t.Fatalf("records %+v skipped %d", res.records, res.skipped)
	}
}

func TestStreamWithoutItsFinalEventFails(t *testing.T) {
	res := threeTurnsAnswered(t, APIMessages, "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":3}}}\n\n"+
		"data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"text_delta\",\"text\":\"x\"}}\n\n")
	if len(res.records) != 1 || res.records[0].Err != "stream ended without message_stop" {
		t.Fatalf("records %+v", res.records)
	}
}

// The bench reads each stream to its end after the final event, as SDKs do: a client that
// hangs up at the final event looks, to a router, like one that left before the answer was
// complete, and its connection cannot be reused.
func TestStreamsAreReadToTheirEnd(t *testing.T) {
	var mu sync.Mutex
	conns, finished := 0, 0
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "data: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":3}}}\n\n"+
			"data: {\"type\":\"message_stop\"}\n\n")
		w.(http.Flusher).Flush()
		time.Sleep(20 * time.Millisecond) // the client has the final event and could hang up
		if _, err := io.WriteString(w, ": the end\n\n"); err == nil {
			w.(http.Flusher).Flush()
			mu.Lock()
			finished++
			mu.Unlock()
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.Start()
	defer srv.Close()
	w := threeTurns()
	res := run(t.Context(), &w, &Target{Name: "t", URLs: []string{srv.URL}}, RunOptions{API: APIMessages, Model: "m", Concurrency: 1})
	if len(res.records) != 3 || res.records[2].Err != "" {
		t.Fatalf("records %+v", res.records)
	}
	mu.Lock()
	defer mu.Unlock()
	if conns != 1 || finished != 3 {
		t.Fatalf("%d connections for 3 turns, %d streams written to their end", conns, finished)
	}
}
