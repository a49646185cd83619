package sim

import (
	"bytes"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// testConfig returns a config that never sleeps, with the tool-call rule
// pinned to its strict loop (every user message gets one call to the tools
// in turn, every tool result gets text), which the tool tests walk through.
// The default rule's own tests start from DefaultConfig.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.TimeScale = 0
	cfg.ToolCallRate, cfg.ToolCallDecay, cfg.ToolPick = 1, 0, ToolPickAny
	return cfg
}

func newWorker(t testing.TB, cfg Config) *Worker {
	t.Helper()
	w, err := NewWorker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Close)
	return w
}

// results collects every Result a worker reports.
type results struct {
	mu  sync.Mutex
	all []Result
}

func collect(w *Worker) *results {
	rs := &results{}
	w.OnResult(func(r Result) {
		rs.mu.Lock()
		rs.all = append(rs.all, r)
		rs.mu.Unlock()
	})
	return rs
}

func (rs *results) list() []Result {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return append([]Result(nil), rs.all...)
}

type msg struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

type chatReply struct {
	Choices []struct {
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
		FinishReason string `json:"finish_reason"`
	} `json:"choices"`
	Usage chatUsage `json:"usage"`
}

// chatChunk is one event of a streamed chat answer.
type chatChunk struct {
	Object  string `json:"object"`
	Choices []struct {
		Delta struct {
			Role      *string     `json:"role"`
			Content   *string     `json:"content"`
			ToolCalls []toolDelta `json:"tool_calls"`
		} `json:"delta"`
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *chatUsage `json:"usage"`
}

// toolDelta is a piece of a tool call in a streamed chat answer.
type toolDelta struct {
	Index    *int    `json:"index"`
	ID       *string `json:"id"`
	Type     *string `json:"type"`
	Function struct {
		Name      *string `json:"name"`
		Arguments *string `json:"arguments"`
	} `json:"function"`
}

// decodeChunks decodes each event as a chat.completion.chunk, failing the test on any other.
func decodeChunks(t *testing.T, events []string) []chatChunk {
	t.Helper()
	chunks := make([]chatChunk, len(events))
	for i, ev := range events {
		if err := json.Unmarshal([]byte(ev), &chunks[i]); err != nil || chunks[i].Object != "chat.completion.chunk" {
			t.Fatalf("event %d %s: %v", i, ev, err)
		}
	}
	return chunks
}

// chatUsage is the usage of a chat or completion answer.
type chatUsage struct {
	PromptTokens        int `json:"prompt_tokens"`
	CompletionTokens    int `json:"completion_tokens"`
	TotalTokens         int `json:"total_tokens"`
	PromptTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"prompt_tokens_details"`
}

// do sends a request straight to the handler.
func do(t testing.TB, h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// chat sends a non-streaming chat request and decodes the reply.
func chat(t testing.TB, h http.Handler, msgs []msg, maxTokens int) chatReply {
	t.Helper()
	body, _ := json.Marshal(map[string]any{
		"model": "sim-model", "messages": msgs, "max_tokens": maxTokens, "ignore_eos": true,
	})
	rec := do(t, h, http.MethodPost, "/v1/chat/completions", string(body))
	return decodeOK[chatReply](t, rec)
}

// decodeOK decodes the JSON body of a 200 answer, failing the test on any other answer.
func decodeOK[T any](t testing.TB, rec *httptest.ResponseRecorder) T {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	var v T
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("decode %q: %v", rec.Body, err)
	}
	return v
}

// words returns a deterministic English-like text of about n bytes.
func words(seed string, n int) string {
	var b bytes.Buffer
	b.WriteString(seed)
	for i := 0; b.Len() < n; i++ {
		b.WriteString(" the router sends each turn to the worker that holds its prefix")
	}
	return b.String()[:n]
}

// clockedConfig is DefaultConfig driven by a manual clock standing at the Unix epoch, returned too.
func clockedConfig() (Config, *ManualClock) {
	clock := NewManualClock(time.Unix(0, 0))
	cfg := DefaultConfig()
	cfg.Clock = clock
	return cfg, clock
}

// flatPrefillConfig is clockedConfig with every prefill taking 10 ms of the clock whatever the
// prompt's length, so that a test moves requests through prefill by advancing the clock in
// whole prefills.
func flatPrefillConfig() (Config, *ManualClock) {
	cfg, clock := clockedConfig()
	cfg.PrefillOverhead = 10 * time.Millisecond
	cfg.PrefillTimePerToken = 0
	return cfg, clock
}

// fullReplies is testConfig with replies that run to max tokens unless a
// tool call ends them: for tests that need a reply long enough to fill a
// block of the cache.
func fullReplies() Config {
	cfg := testConfig()
	cfg.OutputLenDist, cfg.OutputLenMean = OutputLenFixed, 1<<20
	return cfg
}

// refusal is a request a worker must refuse: its body, and the answer's status, error type and a
// part of its message.
type refusal struct {
	name, body string
	code       int
	typ, msg   string
}

// checkRefusals sends each refusal to path on a worker whose context holds 1000 tokens, checks
// each answer with check, and then that the worker counted every one as rejected and none as
// served. It returns the worker.
func checkRefusals(t *testing.T, path string, refusals []refusal, check func(t *testing.T, rec *httptest.ResponseRecorder, r refusal)) *Worker {
	t.Helper()
	cfg := testConfig()
	cfg.MaxModelLen = 1000
	w := newWorker(t, cfg)
	for _, r := range refusals {
		t.Run(r.name, func(t *testing.T) { check(t, do(t, w, http.MethodPost, path, r.body), r) })
	}
	if s := w.Stats(); s.Requests != 0 || s.Rejected != int64(len(refusals)) {
		t.Fatalf("stats %+v, want %d rejected and none served", s, len(refusals))
	}
	return w
}

// anthropicError is an error body in the Messages API's shape.
type anthropicError struct {
	Type  string `json:"type"`
	Error struct {
		Type    string `json:"type"`
		Message string `json:"message"`
	} `json:"error"`
}
