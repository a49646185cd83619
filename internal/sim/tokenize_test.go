package sim

import (
	"encoding/json"
	"net/http"
	"reflect"
	"testing"

	"github.com/cacheroute/cacheroute/internal/sim/prompt"
)

type tokenizeReply struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs"`
}

func postTokenize(t *testing.T, w *Worker, body string) tokenizeReply {
	t.Helper()
	rec := do(t, w, http.MethodPost, "/tokenize", body)
	if rec.Code != http.StatusOK {
		t.Fatalf("tokenize %s: %d %s", body, rec.Code, rec.Body)
	}
	var r tokenizeReply
	if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil {
		t.Fatal(err)
	}
	return r
}

func TestTokenize_APromptGivesItsPseudoTokens(t *testing.T) {
	w := newWorker(t, testConfig())
	r := postTokenize(t, w, `{"model":"sim-model","prompt":"Hello world","return_token_strs":true}`)
	strs := []string{"Hell", "o", " wor", "ld"}
	if r.Count != 4 || !reflect.DeepEqual(r.TokenStrs, strs) || r.MaxModelLen != w.Config().MaxModelLen {
		t.Fatalf("%+v", r)
	}
	for i, s := range strs {
		if r.Tokens[i] != prompt.TokenID(s) {
			t.Fatalf("token %d is %d, want the id of %q", i, r.Tokens[i], s)
		}
	}
	if r := postTokenize(t, w, `{"prompt":"Hello world"}`); r.TokenStrs != nil || r.Count != 4 {
		t.Fatalf("without return_token_strs and model: %+v", r)
	}
}

func TestTokenize_AChatCountsWhatTheChatIsCharged(t *testing.T) {
	w := newWorker(t, testConfig())
	msgs := `[{"role":"system","content":"be brief"},{"role":"user","content":[{"type":"text","text":"Find "},{"type":"text","text":"the bug"}]},` +
		`{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"path\":\"a\"}"}}]},` +
		`{"role":"tool","content":"package main"}]`
	tools := `[{"type":"function","function":{"name":"read","parameters":{}}}]`
	rec := do(t, w, http.MethodPost, "/v1/chat/completions", `{"model":"sim-model","max_tokens":2,"messages":`+msgs+`,"tools":`+tools+`}`)
	var reply chatReply
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &reply) != nil {
		t.Fatalf("chat: %d %s", rec.Code, rec.Body)
	}
	before := w.Stats()
	r := postTokenize(t, w, `{"model":"sim-model","messages":`+msgs+`,"tools":`+tools+`}`)
	if r.Count != reply.Usage.PromptTokens {
		t.Fatalf("/tokenize counts %d tokens, the chat was charged %d", r.Count, reply.Usage.PromptTokens)
	}
	if after := w.Stats(); after.Requests != before.Requests || after.PromptTokens != before.PromptTokens {
		t.Fatal("/tokenize went through the engine")
	}
	bare := postTokenize(t, w, `{"messages":`+msgs+`,"tools":`+tools+`,"add_generation_prompt":false}`)
	if bare.Count >= r.Count || !reflect.DeepEqual(bare.Tokens, r.Tokens[:bare.Count]) {
		t.Fatalf("without the generation prompt: %d tokens, not a prefix of the %d with it", bare.Count, r.Count)
	}
}

func TestTokenize_RefusesWhatItCannotTokenize(t *testing.T) {
	w := newWorker(t, testConfig())
	for body, code := range map[string]int{
		`{"model":"other","prompt":"x"}`:                            http.StatusNotFound,
		`{"model":"sim-model"}`:                                     http.StatusBadRequest,
		`{"prompt":"x","messages":[{"role":"user","content":"x"}]}`: http.StatusBadRequest,
		`{"messages":[]}`:                                           http.StatusBadRequest,
		`{"messages":[{"role":"user","content":"x"}],"continue_final_message":true}`: http.StatusBadRequest,
		`{"messages":[{"role":"user","content":"x"}],"tools":{}}`:                    http.StatusBadRequest,
		`not json`: http.StatusBadRequest,
	} {
		if rec := do(t, w, http.MethodPost, "/tokenize", body); rec.Code != code {
			t.Errorf("%s: %d, want %d", body, rec.Code, code)
		}
	}
}

func TestChatRender_AnswersTheTokensAndMaxTokensWithoutGenerating(t *testing.T) {
	w := newWorker(t, testConfig())
	msgs := `[{"role":"user","content":"Find the bug"}]`
	rec := do(t, w, http.MethodPost, "/v1/chat/completions/render", `{"model":"sim-model","messages":`+msgs+`,"max_tokens":7}`)
	var r struct {
		RequestID      string   `json:"request_id"`
		TokenIDs       []uint32 `json:"token_ids"`
		SamplingParams struct {
			MaxTokens int `json:"max_tokens"`
		} `json:"sampling_params"`
	}
	if rec.Code != http.StatusOK || json.Unmarshal(rec.Body.Bytes(), &r) != nil {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	tok := postTokenize(t, w, `{"messages":`+msgs+`}`)
	if !reflect.DeepEqual(r.TokenIDs, tok.Tokens) || r.SamplingParams.MaxTokens != 7 || r.RequestID == "" {
		t.Fatalf("render %+v, tokenize %v", r, tok.Tokens)
	}
	if w.Stats().Requests != 0 {
		t.Fatal("render generated")
	}
	if rec := do(t, w, http.MethodPost, "/v1/chat/completions/render", `{"model":"other","messages":`+msgs+`}`); rec.Code != http.StatusNotFound {
		t.Fatalf("unknown model: %d", rec.Code)
	}
}

// FuzzTokenize feeds arbitrary bodies to /tokenize: the worker answers 200 or a 4xx, never
// panics, and a 200 counts exactly the tokens it lists.
func FuzzTokenize(f *testing.F) {
	for _, seed := range []string{
		`{"prompt":"Hello world","return_token_strs":true}`,
		`{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`,
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}],"tools":[{"type":"function"}]}`,
		`{"messages":[{"role":"assistant","content":null,"tool_calls":[{"function":{"name":"f","arguments":"{}"}}]}]}`,
		`{"prompt":null}`, `{"prompt":5}`, `{"messages":{}}`, `[]`, `null`, "{\"prompt\":\"\xff\xfe\"}",
	} {
		f.Add(seed)
	}
	w, err := NewWorker(testConfig())
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body string) {
		rec := do(t, w, http.MethodPost, "/tokenize", body)
		if rec.Code != 200 {
			if rec.Code < 400 || rec.Code >= 500 {
				t.Fatalf("status %d for %q", rec.Code, body)
			}
			return
		}
		var r tokenizeReply
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || r.Count != len(r.Tokens) {
			t.Fatalf("%q: answer %s (%v)", body, rec.Body, err)
		}
	})
}
