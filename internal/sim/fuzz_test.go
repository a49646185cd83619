package sim

import (
	"net/http"
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
		`{"messages":[`, `[]`, `null`, `{"messages":[{"role":"user","content":5}]}`, "{\"messages\":[{\"role\":\"user\",\"content\":\"\xff\xfe\"}]}",
	} {
		f.Add(seed)
	}
	cfg := testConfig()
	cfg.MaxModelLen = 4096
	w, err := NewWorker(cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body string) {
		rec := do(t, w, http.MethodPost, "/v1/chat/completions", body)
		if rec.Code != 200 && (rec.Code < 400 || rec.Code >= 500) {
			t.Fatalf("status %d for %q", rec.Code, body)
		}
		if s := w.Stats(); s.Running != 0 || s.PinnedBlocks != 0 {
			t.Fatalf("left running %d pinned %d", s.Running, s.PinnedBlocks)
		}
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
