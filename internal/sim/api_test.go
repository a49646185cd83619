package sim

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestModelsHealthEmbeddings(t *testing.T) {
	cfg := testConfig()
	cfg.Models = []string{"llama", "llama-alias"}
	w := newWorker(t, cfg)

	if rec := do(t, w, "GET", "/health", ""); rec.Code != 200 {
		t.Fatalf("/health status %d", rec.Code)
	}
	rec := do(t, w, "GET", "/v1/models", "")
	var list struct {
		Object string `json:"object"`
		Data   []struct {
			ID     string `json:"id"`
			Object string `json:"object"`
		} `json:"data"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &list); err != nil || list.Object != "list" || len(list.Data) != 2 ||
		list.Data[0].ID != "llama" || list.Data[1].ID != "llama-alias" || list.Data[0].Object != "model" {
		t.Fatalf("/v1/models = %s (%v)", rec.Body, err)
	}

	emb := func(input string) []float64 {
		rec := do(t, w, "POST", "/v1/embeddings", `{"model":"llama","input":`+input+`}`)
		var r struct {
			Data []struct {
				Embedding []float64 `json:"embedding"`
			} `json:"data"`
		}
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || rec.Code != 200 || len(r.Data) == 0 {
			t.Fatalf("embeddings: %d %s", rec.Code, rec.Body)
		}
		return r.Data[0].Embedding
	}
	a, b, c := emb(`"hello"`), emb(`["hello"]`), emb(`"other"`)
	if len(a) != embeddingDims || a[0] != b[0] || a[0] == c[0] {
		t.Fatal("embeddings are not deterministic per input")
	}
}

func TestChat_EOSStopsEarlyOnlyWithoutIgnoreEOS(t *testing.T) {
	w := newWorker(t, testConfig())
	stops := 0
	for i := range 40 {
		body := `{"messages":[{"role":"user","content":"q` + strings.Repeat("x", i) + `"}],"max_tokens":20}`
		var r chatReply
		if err := json.Unmarshal(do(t, w, "POST", "/v1/chat/completions", body).Body.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		n, f := r.Usage.CompletionTokens, r.Choices[0].FinishReason
		switch {
		case f == "stop" && n < 20:
			stops++
		case f == "length" && n == 20:
		default:
			t.Fatalf("finish_reason %q with %d tokens", f, n)
		}
	}
	if stops == 0 || stops == 40 {
		t.Fatalf("%d of 40 requests stopped early; want some, not all", stops)
	}
	for i := range 40 {
		r := chat(t, w, []msg{{"user", "q" + strings.Repeat("x", i)}}, 20) // ignore_eos
		if r.Usage.CompletionTokens != 20 || r.Choices[0].FinishReason != "length" {
			t.Fatalf("ignore_eos: %d tokens, %q", r.Usage.CompletionTokens, r.Choices[0].FinishReason)
		}
	}
}

func TestChat_MaxCompletionTokensAndDefault(t *testing.T) {
	w := newWorker(t, testConfig())
	var r chatReply
	body := `{"messages":[{"role":"user","content":"x"}],"max_tokens":3,"max_completion_tokens":5,"ignore_eos":true}`
	json.Unmarshal(do(t, w, "POST", "/v1/chat/completions", body).Body.Bytes(), &r)
	if r.Usage.CompletionTokens != 5 {
		t.Fatalf("max_completion_tokens ignored: %d tokens", r.Usage.CompletionTokens)
	}
	json.Unmarshal(do(t, w, "POST", "/v1/chat/completions", `{"messages":[{"role":"user","content":"x"}],"ignore_eos":true}`).Body.Bytes(), &r)
	if r.Usage.CompletionTokens != 16 {
		t.Fatalf("default max tokens: %d tokens, want 16", r.Usage.CompletionTokens)
	}
}

func TestChat_ToolsAndContentPartsCountAndCache(t *testing.T) {
	w := newWorker(t, testConfig())
	body := `{"messages":[{"role":"user","content":[{"type":"text","text":"` + words("t", 900) + `"}]},
		{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"read","arguments":"{\"p\":1}"}}]},
		{"role":"tool","tool_call_id":"c1","content":"ok"}],
		"tools":[ {"type":"function","function":{"name":"read"}} ],"max_tokens":2,"ignore_eos":true}`
	var r1, r2 chatReply
	json.Unmarshal(do(t, w, "POST", "/v1/chat/completions", body).Body.Bytes(), &r1)
	// The same tools with different whitespace render the same prompt.
	body2 := strings.Replace(body, `[ {"type"`, `[{"type"`, 1)
	json.Unmarshal(do(t, w, "POST", "/v1/chat/completions", body2).Body.Bytes(), &r2)
	if r1.Usage.PromptTokens < 200 || r2.Usage.PromptTokensDetails.CachedTokens < r1.Usage.PromptTokens-16 {
		t.Fatalf("prompt %d tokens, repeat cached %d", r1.Usage.PromptTokens, r2.Usage.PromptTokensDetails.CachedTokens)
	}
}

func TestCompletion_PromptShapes(t *testing.T) {
	w := newWorker(t, testConfig())
	type reply struct {
		Choices []struct {
			Index int    `json:"index"`
			Text  string `json:"text"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	tests := []struct {
		prompt          string
		choices, tokens int
	}{
		{`"Hello world"`, 1, 4},
		{`["Hello world"]`, 1, 4},
		{`["Hello world", "a b"]`, 2, 6},
		{`[1, 2, 30000]`, 1, 3},
		{`[[1, 2], [3]]`, 2, 3},
	}
	for _, tt := range tests {
		rec := do(t, w, "POST", "/v1/completions", `{"prompt":`+tt.prompt+`,"max_tokens":4,"ignore_eos":true}`)
		var r reply
		if err := json.Unmarshal(rec.Body.Bytes(), &r); err != nil || rec.Code != 200 {
			t.Fatalf("%s: %d %s", tt.prompt, rec.Code, rec.Body)
		}
		if len(r.Choices) != tt.choices || r.Usage.PromptTokens != tt.tokens || r.Usage.CompletionTokens != 4*tt.choices {
			t.Fatalf("%s: %d choices, %d prompt tokens, %d completion tokens", tt.prompt, len(r.Choices), r.Usage.PromptTokens, r.Usage.CompletionTokens)
		}
		for i, c := range r.Choices {
			if c.Index != i || !strings.HasPrefix(c.Text, " ") {
				t.Fatalf("%s: choice %d = %+v", tt.prompt, i, c)
			}
		}
	}
}
