package sim

import (
	"net/http"
	"strings"
	"testing"
)

// FuzzChatRequest feeds arbitrary bodies to the chat endpoint: the worker
// must answer 200 or a 4xx, never panic or hang, and leave nothing running.
func FuzzChatRequest(f *testing.F) {
	for _, seed := range []string{
		`{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}],"tools":[{"type":"function"}]}`,
		`{"messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"properties":{"a":{"type":["null","string"]}},"required":["a"]}}}],"tool_choice":"auto","max_tokens":64,"stream":true}`,
		`{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}],"tool_choice":{"type":"function","function":{"name":"g"}}}`,
		`{"messages":[`, `[]`, `null`, `{"messages":[{"role":"user","content":5}]}`, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
	} {
		f.Add(seed)
	}
	w := fuzzWorker(f)
	f.Fuzz(func(t *testing.T, body string) {
		answeredAndIdle(t, w, body, "/v1/chat/completions")
	})
}

// FuzzCompletionPrompt feeds arbitrary prompt fields to the completions endpoint.
func FuzzCompletionPrompt(f *testing.F) {
	for _, seed := range []string{`"a"`, `["a","b"]`, `[1,2,3]`, `[[1],[2,3]]`, `[]`, `[[]]`, `["a",1]`, `{}`, `-1`} {
		f.Add(seed)
	}
	w, err := NewWorker(testConfig())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, p string) {
		rec := do(t, w, http.MethodPost, "/v1/completions", `{"max_tokens":2,"prompt":`+p+`}`)
		if rec.Code != 200 && rec.Code != 400 {
			t.Fatalf("status %d for prompt %q: %s", rec.Code, p, rec.Body)
		}
	})
}

// FuzzResponsesRequest feeds arbitrary bodies to the Responses endpoint,
// half of them continuing a stored response: the worker must answer 200 or
// a 4xx, never panic or hang, and leave nothing running.
func FuzzResponsesRequest(f *testing.F) {
	for _, seed := range []string{
		`{"input":"hi","max_output_tokens":2}`,
		`{"input":[{"role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"}]}],"instructions":"s"}`,
		`{"input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":[{"type":"input_text","text":"r"}]}]}`,
		`{"input":"w","tools":[{"type":"function","name":"f","parameters":{"type":"object","properties":{"a":{"type":["string","null"]}},"required":["a","a"]}}],"max_output_tokens":40}`,
		`{"input":"w","tools":[{"type":"function","name":"f"}],"tool_choice":{"type":"function","name":"g"},"stream":true}`,
		`{"input":[{"type":"reasoning","summary":[]}]}`, `{"input":[{"role":"assistant"}]}`, `{"input":[5]}`, `{"input":{}}`, `[]`, `null`,
	} {
		f.Add(seed, false)
		f.Add(seed, true)
	}
	w := fuzzWorker(f)
	base := createResponse(f, w, `{"input":"base","max_output_tokens":2}`)
	f.Fuzz(func(t *testing.T, body string, continued bool) {
		if continued && strings.HasPrefix(body, "{") {
			body = `{"previous_response_id":"` + base.ID + `",` + body[1:]
		}
		answeredAndIdle(t, w, body, "/v1/responses")
	})
}

// FuzzMessagesRequest feeds arbitrary bodies to the Messages endpoint and to
// count_tokens.
func FuzzMessagesRequest(f *testing.F) {
	for _, seed := range []string{
		`{"max_tokens":2,"messages":[{"role":"user","content":"hi"}]}`,
		`{"max_tokens":2,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]}`,
		`{"max_tokens":40,"tools":[{"name":"f","input_schema":{"type":"object","properties":{"p":{"enum":[1]}},"required":["p"]}}],"messages":[{"role":"user","content":"x"}],"stream":true}`,
		`{"max_tokens":2,"messages":[{"role":"assistant","content":[{"type":"tool_use","id":"t","name":"f","input":{"a":1}},{"type":"thinking","thinking":"x"}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":[{"type":"text","text":"r"}]},{"type":"text","text":"go"}]}]}`,
		`{"max_tokens":2,"messages":[{"role":"user","content":[]}],"tool_choice":{"type":"tool","name":"f"}}`,
		`{"max_tokens":32000,"thinking":{"type":"adaptive"},"messages":[{"role":"user","content":"hi"},{"role":"system","content":[{"type":"text","text":"agents","cache_control":{"type":"ephemeral"}}]}],"tools":[{"name":"Read","input_schema":{"required":["file_path"]}},{"name":"Bash"}],"tool_choice":{"type":"any"}}`,
		`{"messages":[{"role":"user","content":"x"}]}`, `{"max_tokens":2,"messages":[{"role":"user","content":[7]}]}`, `[]`, `null`,
	} {
		f.Add(seed)
	}
	w := fuzzWorker(f)
	f.Fuzz(func(t *testing.T, body string) {
		answeredAndIdle(t, w, body, "/v1/messages", "/v1/messages/count_tokens")
	})
}

// fuzzWorker is the worker a fuzz target sends its bodies to; its context holds 4096 tokens.
func fuzzWorker(f *testing.F) *Worker {
	cfg := testConfig()
	cfg.MaxModelLen = 4096
	w, err := NewWorker(cfg)
	if err != nil {
		f.Fatal(err)
	}
	return w
}

// answeredAndIdle posts body to each path on w, failing unless every answer is 200 or a 4xx (never
// a 5xx) and w is left with nothing running and no block pinned.
func answeredAndIdle(t *testing.T, w *Worker, body string, paths ...string) {
	t.Helper()
	for _, path := range paths {
		rec := do(t, w, http.MethodPost, path, body)
		if rec.Code != 200 && (rec.Code < 400 || rec.Code >= 500) {
			t.Fatalf("%s: status %d for %q", path, rec.Code, body)
		}
	}
	if s := w.Stats(); s.Running != 0 || s.PinnedBlocks != 0 {
		t.Fatalf("left running %d pinned %d", s.Running, s.PinnedBlocks)
	}
}
