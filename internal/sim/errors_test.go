package sim

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestBadRequests(t *testing.T) {
	cfg := testConfig()
	cfg.MaxModelLen = 1000
	w := newWorker(t, cfg)
	long := strings.Repeat("word ", 1200)
	tests := []struct {
		name, path, body string
		code             int
		msg              string
	}{
		{"malformed JSON", "/v1/chat/completions", `{"messages": [`, 400, "JSON"},
		{"not an object", "/v1/chat/completions", `[1,2]`, 400, "expected"},
		{"missing messages", "/v1/chat/completions", `{"model":"sim-model"}`, 400, "messages"},
		{"empty messages", "/v1/chat/completions", `{"messages":[]}`, 400, "messages"},
		{"messages not a list", "/v1/chat/completions", `{"messages":"hi"}`, 400, "messages"},
		{"content wrong type", "/v1/chat/completions", `{"messages":[{"role":"user","content":5}]}`, 400, "content"},
		{"missing role", "/v1/chat/completions", `{"messages":[{"content":"x"}]}`, 400, "role"},
		{"max_tokens wrong type", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":"9"}`, 400, "max_tokens"},
		{"max_tokens zero", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"max_tokens":0}`, 400, "max_tokens"},
		{"tools not a list", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":{}}`, 400, "tools"},
		{"tool_choice unknown mode", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tool_choice":"sometimes"}`, 400, "tool_choice"},
		{"tool_choice wrong type", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tool_choice":5}`, 400, "tool_choice"},
		{"tool without a name", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{}}],"tool_choice":"auto"}`, 400, "tools[0].function.name"},
		{"prompt too long", "/v1/chat/completions", `{"messages":[{"role":"user","content":"` + long + `"}]}`, 400, "maximum context length is 1000"},
		{"unknown model", "/v1/chat/completions", `{"model":"gpt-9","messages":[{"role":"user","content":"x"}]}`, 404, "gpt-9"},
		{"completion missing prompt", "/v1/completions", `{"max_tokens":3}`, 400, "prompt"},
		{"completion mixed prompt list", "/v1/completions", `{"prompt":["a",1]}`, 400, "prompt"},
		{"completion prompt too long", "/v1/completions", `{"prompt":"` + long + `"}`, 400, "maximum context length"},
		{"completion unknown model", "/v1/completions", `{"model":"x","prompt":"a"}`, 404, "does not exist"},
		{"embedding bad input", "/v1/embeddings", `{"input":5}`, 400, "input"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := do(t, w, "POST", tt.path, tt.body)
			if rec.Code != tt.code {
				t.Fatalf("status %d, want %d: %s", rec.Code, tt.code, rec.Body)
			}
			if rec.Header().Get(HeaderWorker) == "" {
				t.Fatalf("error response without %s", HeaderWorker)
			}
			var e errorBody
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
				t.Fatalf("error body %q: %v", rec.Body, err)
			}
			wantType := "BadRequestError"
			if tt.code == 404 {
				wantType = "NotFoundError"
			}
			if e.Object != "error" || e.Type != wantType || e.Code != tt.code || e.Param != nil {
				t.Fatalf("error body %+v", e)
			}
			if !strings.Contains(e.Message, tt.msg) {
				t.Fatalf("message %q does not mention %q", e.Message, tt.msg)
			}
		})
	}
	if s := w.Stats(); s.Rejected != int64(len(tests)) || s.Requests != 0 {
		t.Fatalf("rejected %d requests %d, want %d and 0", s.Rejected, s.Requests, len(tests))
	}
}

func TestWrongMethodAndUnknownPath(t *testing.T) {
	w := newWorker(t, testConfig())
	if rec := do(t, w, "GET", "/v1/chat/completions", ""); rec.Code != 405 {
		t.Fatalf("GET chat: status %d, want 405", rec.Code)
	}
	if rec := do(t, w, "GET", "/nope", ""); rec.Code != 404 || rec.Header().Get(HeaderWorker) == "" {
		t.Fatalf("unknown path: status %d", rec.Code)
	}
}
